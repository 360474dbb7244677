"""Entry point: `python -m services.up` (the same as `fedasync up`)."""

from __future__ import annotations

import sys

from services.cli import main

if __name__ == "__main__":
    sys.exit(main(["up", *sys.argv[1:]]))
