"""Local learning: tasks, data, partitions, models and training.

Shared by the simulator and the device worker, so both train the same way.
"""
