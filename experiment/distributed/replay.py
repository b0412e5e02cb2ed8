"""The replay role: one Reverb server with the replay and variables tables, checkpointed.

The server loads the newest complete checkpoint in `<root>/replay/reverb`
when it starts, so a killed server restarted with the same command comes
back with every window and the weights it had at its last checkpoint
(taken every `server_checkpoint_interval_s` and on SIGINT/SIGTERM; the
last two are kept as `<root>/replay/reverb/ckpt-NNNNNN/`). The table itself
is the run's Reverb replay backend hosting its server (`port=`,
`rate_limiter=`), so its layout is the single-process one.
Collectors and the learner reconnect by themselves. Items inserted after
the last checkpoint are lost with the process: experience is cheap to
collect again, and the learner's own checkpoint never depends on them.

Its rate limiter's counts are restored with the table, so the
samples-per-insert ratio continues where it was; with a finite error buffer
validated before start, the restored state is one the limiter could have
been in anyway, so it cannot block both sides.
"""

import dataclasses
import os
import time

import reverb

from buffers.reverb.server import ReplayServer, latest_checkpoint
from core import rundir
from core.errors import UserError
from experiment.distributed import common, config, net, tables, tier
from experiment.distributed.waiting import one_line
from experiment.replay import Mode, ServerLink, build_replay


def main(root_dir, *, address, shard=0, bind_all_interfaces=False, seed=0, force=False,
         verbose=True):
    """Serves the tables until SIGINT/SIGTERM; returns the final table counters.

    `address` lists every shard's HOST:PORT (one with one shard); this process serves
    the `shard`-th, with 1/K of the capacity and of the rate limiter's bounds, and shard
    0 also the weights table.
    """
    params, settings, role, directory = common.start_role('replay', root_dir, force=force,
                                                          seed=seed, shard=shard)
    addresses = tier.parse_addresses(address, settings.replay_shards)
    if not 0 <= shard < len(addresses):
        raise UserError(f"--shard={shard} is not one of the {len(addresses)} replay shards "
                        f"(0 to {len(addresses) - 1}).")
    host, port = net.parse_address(addresses[shard])
    net.check_replay_exposure(host, bind_all_interfaces=bind_all_interfaces)
    agent, _, tf_env = common.build_agent(params, seed=seed)
    settings = config.for_agent(settings, agent)
    checkpoint_dir = os.path.join(directory, 'reverb')
    restoring = latest_checkpoint(checkpoint_dir)
    weights = [tables.variables_table(agent.collect_policy.variables())] if shard == 0 else []
    # The replay backend hosts the server: the table's layout, sampler and checkpoints are
    # the ones a single-process Reverb run uses, with the distributed rate limiter. With
    # pixels the table stores single frames; collectors and the learner stack them.
    shard_params = dataclasses.replace(
        params, replay_capacity=params.replay_capacity // settings.replay_shards)

    def serve(checkpoint):
        server = ReplayServer(checkpoint_dir=checkpoint_dir, port=port,
                              rate_limiter=config.rate_limiter(settings),
                              extra_tables=weights, initial_checkpoint=checkpoint)
        link = ServerLink(timeout_s=settings.timeout_s, server=server,
                          queue_length=settings.queue_length or None)
        return server, build_replay(Mode.SERVER, shard_params, agent,
                                    num_envs=tf_env.batch_size, seed=seed, link=link).hosted

    try:
        server, backend = serve(restoring)
    except UserError as error:
        if settings.replay_shards == 1 or restoring is None:
            raise
        # One shard of several: the run goes on with this shard empty rather than stopping.
        damaged = f'{restoring}.damaged'
        os.replace(restoring, damaged)
        role.log(f"cannot restore {restoring} ({error}); starting this shard empty (the "
                 f"checkpoint is kept as {damaged})")
        restoring = None
        server, backend = serve(None)
    backend_class = type(backend)
    client = reverb.Client(server.address)
    counters = common.replay_counters(client.server_info(int(settings.timeout_s)))
    if restoring:
        role.log(f"restored {restoring}: {counters['size']:,} windows, "
                 f"{counters['inserted']:,} inserted, {counters['sampled']:,} sampled")
    where = 'every interface' if bind_all_interfaces else 'loopback only (private namespace)'
    if settings.learner_holds_replay:
        role.log(f"serving {backend_class.__name__} on port {port} ({where}): a queue of "
                 f"{settings.queue_length:,} windows to the learner, which holds the replay")
    elif settings.replay_shards > 1:
        role.log(f"serving {backend_class.__name__} on port {port} (shard {shard} of "
                 f"{settings.replay_shards}, {where}); min_size_to_sample="
                 f"{settings.shard_min_size():,} (the ratio is kept over all shards by the "
                 f"learner and collectors), capacity {backend.capacity:,}")
    else:
        role.log(f"serving {backend_class.__name__} on port {port} ({where}); "
                 f"samples_per_insert={settings.samples_per_insert:g}, error_buffer="
                 f"{settings.error_buffer:g}, min_size_to_sample="
                 f"{settings.min_size_to_sample:,}")
    summaries = common.RateSummaries(os.path.join(directory))
    role.install_signal_handlers()
    try:
        counters = _serve(role, server, client, settings, summaries, verbose=verbose)
    finally:
        summaries.close()
        backend.close()
        server.stop()
        role.restore_signal_handlers()
    rundir.write_metrics(directory, counters)
    role.log("stopped")
    return counters


def _serve(role, server, client, settings, summaries, *, verbose):
    now = time.monotonic()
    next_checkpoint = now + settings.server_checkpoint_interval_s
    next_summary = now
    while True:
        stopping = role.stop.wait(0.5)
        now = time.monotonic()
        if stopping or now >= next_checkpoint:
            try:
                path = server.save_checkpoint()
            except (RuntimeError, OSError) as error:  # a full disk must not take the server down
                role.log(f"checkpoint failed ({one_line(error)}); the previous one is kept")
            else:
                if stopping and verbose:
                    role.log(f"final checkpoint {path}")
            next_checkpoint = now + settings.server_checkpoint_interval_s
        if stopping or now >= next_summary:
            counters = common.replay_counters(client.server_info(int(settings.timeout_s)))
            _write_summaries(summaries, counters)
            next_summary = now + settings.summary_interval_s
        if stopping:
            return counters


def _write_summaries(summaries, counters):
    values = summaries.write(counters['inserted'], {'replay/size': counters['size']}, {
        'replay/inserted': counters['inserted'], 'replay/sampled': counters['sampled'],
        'replay/insert_blocked_ms': counters['insert_blocked_ms'],
        'replay/sample_blocked_ms': counters['sample_blocked_ms']})
    if 'replay/inserted_per_sec' in values:
        # Fractions of wall time the rate limiter held inserts (or samples) back.
        extra = {'replay/insert_blocked_fraction':
                 values['replay/insert_blocked_ms_per_sec'] / 1000.0,
                 'replay/sample_blocked_fraction':
                 values['replay/sample_blocked_ms_per_sec'] / 1000.0}
        inserted = values['replay/inserted_per_sec']
        if inserted > 0:
            extra['replay/samples_per_insert'] = values['replay/sampled_per_sec'] / inserted
        summaries.write(counters['inserted'], extra)
