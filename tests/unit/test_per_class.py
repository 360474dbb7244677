"""The one rule that flags a class the model has not learned (shared/per_class.py)."""

from __future__ import annotations

from fedasync.shared.per_class import LaggingClass, describe_lagging, lagging_classes

#: the README demo's final per-class accuracies before its budget was long enough (class 8: 0)
DEMO = {"0": 0.95, "1": 0.79, "2": 0.88, "3": 0.89, "4": 0.92, "5": 0.93, "6": 1.0, "7": 1.0,
        "8": 0.0, "9": 0.69}  # fmt: skip


def test_a_class_at_zero_is_flagged_in_one_line() -> None:
    flagged = lagging_classes(DEMO)
    assert flagged == [LaggingClass("8", 0.0, 0.92)]
    assert describe_lagging(flagged) == (
        "class 8 at 0.00 (the others' median 0.92): the model has not learned it"
    )


def test_a_class_far_below_the_others_is_flagged_and_one_merely_lower_is_not() -> None:
    far = DEMO | {"8": 0.3}  # under half of 0.92
    assert [c.label for c in lagging_classes(far)] == ["8"]
    assert lagging_classes(DEMO | {"8": 0.57}) == []  # the longer demo: kept, if behind


def test_a_hard_task_with_every_class_alike_flags_none() -> None:
    assert lagging_classes({0: 0.41, 1: 0.38, 2: 0.44}) == []
    assert describe_lagging([]) is None


def test_several_classes_are_named_in_label_order() -> None:
    flagged = lagging_classes({10: 0.9, 2: 0.0, 1: 0.95, 3: 0.9, 4: 0.05})
    assert [c.label for c in flagged] == ["2", "4"]
    line = describe_lagging(flagged)
    assert line is not None
    assert line.startswith("classes 2 at 0.00 (the others' median 0.90), 4 at 0.05")
