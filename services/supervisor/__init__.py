"""The supervisor: one aggregator process (and one evaluator) per active run of a deployment.

Exactly one aggregator decides each run; with many runs, something must start one when a run is
created, restart it when it dies and stop it when the run is done. The supervisor reads the run
directory every `poll_s`, and keeps one child per run and role, each a `python -m` process of its
own, so a crash or a kill -9 touches one run only. A doubled child (two supervisors, or one
started by hand) is fenced off by the run's epoch and never decides twice.
"""
