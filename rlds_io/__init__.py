"""RLDS datasets on disk: recording experience, writing and reading TFDS-format episodes."""
