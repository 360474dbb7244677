"""The evaluator: scores each committed version on the held-out test set, off the hot path."""
