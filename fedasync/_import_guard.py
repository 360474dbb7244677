"""One import path per module: the refusal a project folder gives when imported by its bare name.

The repository keeps `shared/`, `services/`, `learning/` and `sim/` at its top and `fedasync/`
links to each, so from the repository's root `import shared.policy` would find the same file as
`import fedasync.shared.policy` and load it a second time, as a different module. Its classes and
enums would not be the ones the rest of fedasync holds, and the core compares enum members with
`is` (the norm bound's action, the server optimizer's kind; before the strategies, the modes too:
a FedAsync policy built from `shared.policy` was decided as FedBuff). So the
`__init__.py` of each of the four folders checks the name it is being imported under and, for any
name but `fedasync.<folder>`, calls `refuse` before it runs anything else.

This module imports nothing of the project: it is loaded only to word that error.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import NoReturn


def requested(package: str) -> str:
    """The module the import being refused asked for: `shared.policy` for `import shared.policy`
    (Python imports the parent package `shared` first, so the package's `__init__` runs inside
    the import of `shared.policy`; that outer import's frame holds the full name). `package`
    itself when no frame names more (`import shared`, `from shared import policy`)."""
    wanted = package
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:  # inner to outer: the outermost import of this package wins
        if frame.f_code.co_name == "_find_and_load":
            name = frame.f_locals.get("name")
            if isinstance(name, str) and (name == package or name.startswith(package + ".")):
                wanted = name
        frame = frame.f_back
    return wanted


def refuse(imported_as: str, folder: str) -> NoReturn:
    """Raise the ImportError that names the right import for the project folder `folder`
    (`shared`) imported as `imported_as` (its `__name__`: `shared`, or `repo.shared` with the
    checkout's parent on the path) instead of `fedasync.shared`."""
    wrong = requested(imported_as)
    right = f"fedasync.{folder}{wrong[len(imported_as) :]}"
    raise ImportError(
        f"import {right}, not {wrong}: the repository's {folder}/ folder is the package "
        f"fedasync.{folder} (fedasync/{folder} links to it), and under a second name "
        f"its modules would load twice, with classes and enums that are not the ones the rest "
        f"of fedasync compares against (a policy's mode decided as another's); "
        f"see docs/architecture.md, 'One package'",
        name=wrong,
    )
