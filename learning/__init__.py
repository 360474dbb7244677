"""Local learning: tasks, data partitions, models and training, shared by the simulator and the device worker."""
