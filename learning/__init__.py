"""Local learning: tasks, data, partitions, models and training.

Shared by the simulator and the device worker, so both train the same way.
"""

if __name__ != "fedasync.learning":  # one import path per module (fedasync/_import_guard.py)
    from fedasync._import_guard import refuse

    refuse(__name__, "learning")
