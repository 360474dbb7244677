"""What the compose tests share besides fixtures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the build arguments of an air-gapped build: the wheelhouse, and no index
AIR_GAPPED = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels"}


@dataclass(frozen=True, slots=True)
class Images:
    """How long the session's wheelhouse and image build took, seconds."""

    wheelhouse_s: float
    build_s: float
