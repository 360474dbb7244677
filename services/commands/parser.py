"""The argument parser of every `fedasync` subcommand: its own usage on a wrong option, no guesses.

argparse leaves an unknown option of a subcommand to the top-level parser, which prints
`usage: fedasync COMMAND ...`: a user who typed `fedasync up --devcies 3` is shown the list of
commands, not the options of `up`. And it takes a prefix of an option for the whole
(`--max-update 5` ran with `--max-updates 5`), so a typo can silently set another option.
Here a subcommand reports what it does not know itself, with the nearest option it has.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser that rejects unknown options with its own usage and a suggestion."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unknown(extras))
        return parsed, extras

    def _unknown(self, extras: list[str]) -> str:
        message = f"unrecognized arguments: {' '.join(extras)}"
        options = list(self._option_string_actions)
        for extra in extras:
            if extra.startswith("--"):
                close = difflib.get_close_matches(extra.split("=", 1)[0], options, n=1)
                if close:
                    message += f" (did you mean {close[0]}?)"
                    break
        return message
