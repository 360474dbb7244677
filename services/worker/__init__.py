"""The device worker: `python -m services.worker` or `fedasync worker`."""
