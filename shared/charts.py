"""Figures for reports: the one way the simulator's report and `fedasync up`'s run folder draw.

matplotlib's object API on the Agg canvas (no GUI, no pyplot state), and a PNG rendered to bytes
without the software tag, so the same chart gives the same bytes on any machine. It lives in the
core, not in sim/, because production (`fedasync up`) draws with it too and must not import the
simulator; it writes no file (callers do), and matplotlib is imported only by whoever draws.
"""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 100
#: a report-sized chart, inches
WIDTH, HEIGHT = 7.5, 4.5


def new_figure(width: float = WIDTH, height: float = HEIGHT) -> Figure:
    """A figure on the Agg canvas, laid out so labels never overlap."""
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def png_bytes(figure: Figure) -> bytes:
    """The figure as PNG, without the software tag (it names the matplotlib version)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
