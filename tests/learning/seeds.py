"""The learning tests' "2 of 3 seeds" rule: run seeds until two reach the target, or all three."""

from app import cli


def seeds_reaching_target(gin_file, root, within_steps, *, bindings=(), mixins=()):
    """{seed: (reached the config's target_return within `within_steps` env steps, best eval)}.

    Stops as soon as two seeds have reached it; every run stops at its target.
    """
    solved = {}
    for seed in (0, 1, 2):
        metrics = cli.train_main([
            f'--gin_file={gin_file}', *[f'--gin_file={mixin}' for mixin in mixins],
            f'--root_dir={root / f"seed_{seed}"}', f'--seed={seed}',
            '--gin_bindings=run.stop_at_target_return=True',
            '--gin_bindings=run.final_video=False',
            *[f'--gin_bindings={binding}' for binding in bindings],
        ])
        assert metrics['unused_bindings'] == []
        steps = metrics['steps_to_target']
        solved[seed] = (steps is not None and steps <= within_steps, metrics['best_eval_return'])
        if sum(ok for ok, _ in solved.values()) >= 2:
            break
    return solved
