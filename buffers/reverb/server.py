"""An in-process Reverb server with its own checkpoint directory, owned by whoever hosts it.

A single-process Reverb backend hosts one for its own table; the distributed
replay role hosts one for the run's replay table (with a samples-per-insert
rate limiter) and the weights table, and passes it to the backend that defines
the replay table. Either way the host starts, checkpoints and stops it; the
backend only reads and writes through it.

Checkpoint layout under `checkpoint_dir`:

    <checkpoint_dir>/server/       the Reverb checkpointer's root; kept empty
    <checkpoint_dir>/ckpt-000007/  one saved Reverb checkpoint (the last
                                   `keep_checkpoints`, default 2, are kept)

Reverb itself keeps only its newest checkpoint and loads the newest one in its
root, so each save is moved out of `server/` at once: older training
checkpoints keep their replay, and a restart loads exactly the one asked for.

Reverb 0.14 always listens on all interfaces (`[::]:port`) and offers no way
to bind 127.0.0.1 only, so do not run it on an untrusted network.
"""

import os
import re
import shutil

import reverb

from core.errors import UserError

CHECKPOINT_PATTERN = re.compile(r'^ckpt-(\d+)$')


def latest_checkpoint(checkpoint_dir):
    """The newest complete Reverb checkpoint kept in `checkpoint_dir`, or None."""
    if not os.path.isdir(checkpoint_dir):
        return None
    kept = sorted(name for name in os.listdir(checkpoint_dir) if CHECKPOINT_PATTERN.match(name)
                  and os.path.isfile(os.path.join(checkpoint_dir, name, 'DONE')))
    return os.path.join(checkpoint_dir, kept[-1]) if kept else None


class ReplayServer:
    """A `reverb.Server` on this machine: its tables, port, rate limiter and checkpoints."""

    def __init__(self, *, checkpoint_dir, port=None, rate_limiter=None, extra_tables=(),
                 initial_checkpoint=None, keep_checkpoints=2):
        """Describes the server; `host` starts it with the replay table.

        Args:
          checkpoint_dir: where its Reverb checkpoints are kept (see the module docstring).
          port: the port to serve on (None: a free one).
          rate_limiter: the replay table's rate limiter (None: `MinSize(1)`, which never
            throttles inserts against samples and can never block sampling after a
            restore; the distributed replay role passes a `SampleToInsertRatio`).
          extra_tables: more `reverb.Table`s to serve (the distributed run's weights).
          initial_checkpoint: a kept checkpoint to start from (None: empty tables).
          keep_checkpoints: how many saved checkpoints to keep.
        """
        self.checkpoint_dir = os.path.abspath(checkpoint_dir)
        self.rate_limiter = rate_limiter
        self._port = port
        self._extra_tables = list(extra_tables)
        self._initial_checkpoint = initial_checkpoint
        self._keep = keep_checkpoints
        self._make_table = None
        self._server = None

    @property
    def address(self):
        return f'localhost:{self._server.port}'

    @property
    def running(self):
        return self._server is not None

    def host(self, make_table):
        """Starts serving the table `make_table(rate_limiter)` returns, and the extra tables."""
        self._make_table = make_table
        self._start(self._initial_checkpoint)

    def _start(self, checkpoint):
        root = os.path.join(self.checkpoint_dir, 'server')
        # Reverb loads the newest checkpoint in its root before the fallback; an
        # interrupted save may have left one there, and it must not win.
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        checkpointer = reverb.checkpointers.DefaultCheckpointer(
            path=root, fallback_checkpoint_path=checkpoint)
        table = self._make_table(self.rate_limiter or reverb.rate_limiters.MinSize(1))
        try:
            self._server = reverb.Server([table, *self._extra_tables], port=self._port,
                                         checkpointer=checkpointer)
        except RuntimeError as error:
            raise UserError(
                f"Reverb could not load the replay checkpoint {checkpoint}: "
                f"{str(error).strip().splitlines()[0][:200]}. Did replay_capacity, num_steps or "
                "the agent's data spec change since it was written? Restore with the same "
                "settings, or start a new --root_dir.") from None

    def save_checkpoint(self):
        """Writes a Reverb checkpoint now and keeps it; returns its kept path."""
        return self.keep(reverb.Client(self.address).checkpoint())

    def keep(self, path):
        """Moves a fresh Reverb checkpoint out of the server root and prunes old ones."""
        numbers = sorted(int(m.group(1)) for m in map(CHECKPOINT_PATTERN.match,
                                                      os.listdir(self.checkpoint_dir)) if m)
        number = (numbers[-1] if numbers else 0) + 1
        kept = os.path.join(self.checkpoint_dir, f'ckpt-{number:06d}')
        os.replace(path, kept)
        for old in [*numbers, number][:-self._keep]:
            shutil.rmtree(os.path.join(self.checkpoint_dir, f'ckpt-{old:06d}'),
                          ignore_errors=True)
        return kept

    def resolve(self, path):
        """A recorded checkpoint path, or its namesake here if the run directory moved."""
        for candidate in (path, os.path.join(self.checkpoint_dir, os.path.basename(path))):
            if os.path.isfile(os.path.join(candidate, 'DONE')):
                return candidate
        raise UserError(
            f"its Reverb checkpoint is missing: {path} (nor in {self.checkpoint_dir}); was "
            "the replay checkpoint_dir a temporary one? Restore another checkpoint, or start "
            "a new --root_dir.")

    def restart(self, checkpoint):
        """Stops the server and starts it again from `checkpoint` (a kept path)."""
        self.stop()
        self._start(checkpoint)

    def stop(self):
        """Stops serving; harmless when not running."""
        if self._server is not None:
            self._server.stop()
            self._server = None
