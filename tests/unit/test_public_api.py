"""`import fedasync`: its public names and its subpackages, loaded on first use (PEP 562)."""

from __future__ import annotations

import pytest

import fedasync


def test_every_public_name_resolves() -> None:
    for name in fedasync.__all__:
        assert getattr(fedasync, name) is not None, name


def test_the_subpackages_are_attributes_as_when_imported_eagerly() -> None:
    assert fedasync.client.DeviceClient is fedasync.DeviceClient
    assert fedasync.learning.task.Task is fedasync.Task
    assert {"client", "learning", "torch"} <= set(dir(fedasync))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = fedasync.nope
