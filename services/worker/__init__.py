"""The device worker: `python -m fedasync.services.worker` or `fedasync worker`."""
