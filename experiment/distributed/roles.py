"""One entry point for the four roles, as `train.py --role=...` calls them."""

from core.errors import UserError

ROLES = ('replay', 'collect', 'learn', 'eval')


def run_role(role, root_dir, *, address, collector_id=0, shard=0, seed=0, force=False,
             bind_all_interfaces=False):
    """Runs one role of a distributed run (Gin already parsed); returns its final metrics."""
    if not address:
        raise UserError(f"--role={role} needs --replay_address=HOST:PORT[,HOST:PORT...] (the "
                        "replay server's, or every shard's in order; --role=replay serves "
                        "the --shard-th).")
    if shard and role != 'replay':
        raise UserError("--shard applies to --role=replay only.")
    if bind_all_interfaces and role != 'replay':
        raise UserError("--bind_all_interfaces applies to --role=replay only.")
    if role == 'replay':
        from experiment.distributed import replay
        return replay.main(root_dir, address=address, shard=shard, seed=seed, force=force,
                           bind_all_interfaces=bind_all_interfaces)
    if role == 'collect':
        from experiment.distributed import collector
        return collector.main(root_dir, address=address, collector_id=collector_id, seed=seed,
                              force=force)
    if role == 'learn':
        from experiment.distributed import learner
        return learner.main(root_dir, address=address, seed=seed, force=force)
    if role == 'eval':
        from experiment.distributed import evaluator
        return evaluator.main(root_dir, address=address, seed=seed, force=force)
    raise UserError(f"--role={role!r}: choose one of {', '.join(ROLES)}.")
