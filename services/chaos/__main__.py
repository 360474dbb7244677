"""Entry point: `python -m services.chaos` (the same as `fedasync chaos`)."""

from __future__ import annotations

import sys

from services.chaos.cli import main

if __name__ == "__main__":
    sys.exit(main())
