"""The snapshot service: `python -m services.snapshot` or `fedasync snapshot`."""
