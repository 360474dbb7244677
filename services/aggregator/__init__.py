"""The aggregator service: `python -m fedasync.services.aggregator` or `fedasync aggregator`."""
