"""Tests of the learning tasks and partitions (learning/)."""
