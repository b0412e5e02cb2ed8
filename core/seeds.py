"""Every seed a run derives from its `--seed`, as named streams.

Each stream is its own range of seeds, so no two ever draw the same random
numbers: a collector's environments never replay the evaluation episodes, and
the best policy's confirmation and the end-of-run report play fixed episodes
shared by every run and seed (the same start states for every candidate).
Every mode (single process, offline, the distributed roles) takes its seeds
from here; nothing adds an offset of its own.

Ranges: collection `seed` (+ 1,000 per distributed collector), evaluation
`seed + 10,000`, evaluation actions (epsilon) `seed + 20,000`, confirmation
2,000,000, report 3,000,000. Seeds up to 9,999 keep the streams apart.
"""

EVALUATION_OFFSET = 10_000
EVALUATION_ACTIONS_OFFSET = 20_000
COLLECTOR_STRIDE = 1_000

# The fixed seed of the best policy's confirmation episodes: the same start states for
# every candidate, run and seed, never a training, evaluation or report seed.
CONFIRMATION = 2_000_000
# The fixed seed of the end-of-run report's episodes (final and best policy alike).
REPORT = 3_000_000


def collection(seed, collector_id=None):
    """The training environments' seed; distributed collector `collector_id` gets its own."""
    return seed if collector_id is None else seed + COLLECTOR_STRIDE * (collector_id + 1)


def evaluation(seed):
    """The periodic evaluation environments' (and videos') seed."""
    return seed + EVALUATION_OFFSET


def evaluation_actions(seed):
    """The seed of the evaluation policy's own randomness (its epsilon draws)."""
    return seed + EVALUATION_ACTIONS_OFFSET


def resumed(seed, step):
    """A fresh, reproducible seed for RNG streams restarted at a resume from `step`."""
    return seed if step == 0 else (seed * 1_000_003 + step) % (2**31 - 1)
