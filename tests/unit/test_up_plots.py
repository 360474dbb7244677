"""The run folder's charts say what happened: steps from the first evaluation, every client."""

from __future__ import annotations

from pathlib import Path

from matplotlib.collections import PathCollection
from matplotlib.patches import Rectangle

from fedasync.services.commands.up import plots
from fedasync.services.stores.evaluations import EvaluationRecord

STARTED = 1000.0


def evaluated(version: int, after_s: float, score: float) -> EvaluationRecord:
    committed = STARTED + after_s
    return EvaluationRecord(
        version, committed + 0.1, committed, 1.0, score, 50, score, {"0": score, "1": score}
    )


def test_accuracy_is_drawn_as_steps_from_the_first_evaluation(tmp_path: Path) -> None:
    # version 0 at the start, then nothing for 35 s while the devices start: no slope there
    curve = [evaluated(0, 0.0, 0.07), evaluated(1, 35.0, 0.2), evaluated(2, 36.0, 0.5)]
    figure = plots.accuracy_figure(curve, STARTED)
    assert figure is not None
    [ax] = figure.axes
    assert ax.lines  # overall and one per class
    for line in ax.lines:
        assert line.get_drawstyle() == "steps-post"  # held flat until the next version
        assert list(line.get_xdata()) == [0.0, 35.0, 36.0]
    assert ax.get_xlim()[0] == 0.0  # the axis starts at the first evaluation
    shaded = [p for p in ax.patches if p.get_label().startswith("start-up")]
    assert len(shaded) == 1  # the start-up is named, not drawn as learning
    assert plots.accuracy(curve, STARTED, tmp_path) == "accuracy.png"
    assert (tmp_path / "accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_a_client_at_zero_acceptance_is_drawn_and_labelled(tmp_path: Path) -> None:
    clients = [
        {"client": "device-0", "applied": 0, "decided": 12, "rate": 0.0},
        {"client": "device-3", "applied": 9, "decided": 10, "rate": 0.9},
    ]
    figure = plots.acceptance_figure(clients)
    assert figure is not None
    [ax] = figure.axes
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() < 1]
    assert sorted(bar.get_width() for bar in bars) == [0.0, 0.9]  # a 0% bar has no width...
    [marker] = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert marker.get_label() == "no update applied"  # ...so a marker shows it
    assert len(marker.get_offsets()) == 1
    labels = {t.get_text() for t in ax.texts}
    assert labels == {"0% (0 of 12)", "90% (9 of 10)"}
    assert plots.acceptance(clients, tmp_path) == "acceptance.png"
