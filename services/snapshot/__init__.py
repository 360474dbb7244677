"""The snapshot service: `python -m fedasync.services.snapshot` or `fedasync snapshot`."""
