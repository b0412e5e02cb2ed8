"""Reverb replay, split by job: column layout, writer, reader, and the server its host owns."""
