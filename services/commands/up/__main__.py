"""Entry point: `python -m fedasync.services.commands.up` (the same as `fedasync up`)."""

from __future__ import annotations

import sys

from fedasync.services.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["up", *sys.argv[1:]]))
