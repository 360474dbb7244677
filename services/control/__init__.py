"""The control service: `python -m fedasync.services.control` or `fedasync control`."""
