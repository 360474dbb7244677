"""The control service: `python -m services.control` or `fedasync control`."""
