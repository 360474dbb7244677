"""User-level central differential privacy: clipping, noise, what has been spent, accounting.

One implementation, driven by `AggregationState` (shared/aggregation.py) for the simulator, the
aggregator and `ledger verify` alike: `clipping` bounds each device's contribution to C (fixed,
or adaptive after Andrew et al. 2021), `noise` draws the Gaussian noise of a server step from
the run's secret, `spent` is the state that records what each step released, and `accounting`
turns that into ε with Google's dp-accounting (imported only when ε is asked for).
"""
