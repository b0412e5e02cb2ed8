"""Distributed training around one Reverb server: replay, collectors, learner, evaluator.

One Gin config (an experiment config plus `distributed.settings` bindings)
drives four roles, each its own process, started by `train.py --role=...` or
all together on one machine by `launch.py`:

    replay   a `reverb.Server` holding the replay table (rate limited by
             samples-per-insert) and a one-item `variables` table with the
             latest policy weights; checkpoints both
    collect  steps batched envs with the latest weights it pulled, writes
             windows to the replay table
    learn    samples batches through a Reverb dataset inside `tf.function`,
             trains K steps per call, checkpoints, pushes weights
    eval     evaluates the latest weights every `run.eval_interval` env steps

Every wait on another process is bounded: calls carry timeouts, failures
are retried with backoff and a log line naming who waits on whom, and a
watchdog ends a role that stays blocked past `give_up_after_s`.
"""
