"""The deterministic, event-driven simulator: the core in shared/ plus virtual time."""

if __name__ != "fedasync.sim":  # one import path per module (fedasync/_import_guard.py)
    from fedasync._import_guard import refuse

    refuse(__name__, "sim")
