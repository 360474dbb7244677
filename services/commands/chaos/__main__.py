"""Entry point: `python -m fedasync.services.commands.chaos` (the same as `fedasync chaos`)."""

from __future__ import annotations

import sys

from fedasync.services.commands.chaos.cli import main

if __name__ == "__main__":
    sys.exit(main())
