"""Which classes a model has not learned: one rule for every summary that shows per-class accuracy.

An overall accuracy of 0.82 can hide a class at 0: with ten classes, one never predicted costs
only a tenth. The case fedasync is built to expose (a class that only slow devices hold,
forgotten by FedAsync and FedBuff) looks like a good run on the overall figure, so `fedasync up`,
the simulator and their summary.json files flag such a class with this one rule, in one line.

Pure: accuracies in, flagged classes out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

#: a class under this share of the median of the other classes is flagged as not learned
FAR_BELOW = 0.5


@dataclass(frozen=True, slots=True)
class LaggingClass:
    """A class at 0, or far below the others: its accuracy and the other classes' median."""

    label: str
    accuracy: float
    others_median: float

    def to_dict(self) -> dict[str, str | float]:
        return {"class": self.label, "accuracy": self.accuracy, "others_median": self.others_median}


def lagging_classes(per_class: Mapping[str, float] | Mapping[int, float]) -> list[LaggingClass]:
    """The classes at 0, or under FAR_BELOW × the median of the other classes, in label order.

    A class is compared with the others, not with a fixed figure, so a hard task whose classes
    are all at 0.4 flags none, and a class at 0.3 among classes at 0.95 is flagged. A single
    class has no others: only 0 flags it.
    """
    items = [(str(label), float(value)) for label, value in per_class.items()]
    flagged = []
    for label, accuracy in items:
        others = [value for other, value in items if other != label]
        median = statistics.median(others) if others else 0.0
        if accuracy <= 0.0 or accuracy < FAR_BELOW * median:
            flagged.append(LaggingClass(label, accuracy, median))
    return sorted(flagged, key=lambda c: (len(c.label), c.label))


def describe_lagging(lagging: list[LaggingClass]) -> str | None:
    """One line naming each flagged class and its accuracy, or None when there is none."""
    if not lagging:
        return None
    shown = ", ".join(
        f"{c.label} at {c.accuracy:.2f} (the others' median {c.others_median:.2f})" for c in lagging
    )
    noun, pronoun = ("class", "it") if len(lagging) == 1 else ("classes", "them")
    return f"{noun} {shown}: the model has not learned {pronoun}"
