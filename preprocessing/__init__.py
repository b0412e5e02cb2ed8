"""The preprocessing stage between the environment and the agent.

Replay keeps raw observations and rewards; this stage transforms them twice,
with the same current statistics: when acting (inside every policy, so the
exported SavedModel takes raw observations) and when a batch is sampled for a
gradient step (so old data never carries stale normalisation). See
preprocessing/stage.py for the order and docs/training.md ("Preprocessing").
"""
