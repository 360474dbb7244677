"""The aggregator service: `python -m services.aggregator` or `fedasync aggregator`."""
