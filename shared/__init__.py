"""fedasync's pure core: staleness rules, policy, aggregation state machine, wire codec.

Nothing in this package performs I/O, reads a clock or draws random numbers; the simulator and
every service compose it, so the same inputs always give the same decisions.
"""

if __name__ != "fedasync.shared":  # one import path per module (fedasync/_import_guard.py)
    from fedasync._import_guard import refuse

    refuse(__name__, "shared")

__version__ = "0.1.0"
