"""ModelVersions.default: the version a request naming none gets (the highest READY one, else the highest), with the
one-version shortcut the request path takes (service/core/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from service.core.errors import InvalidRequest, ModelNotFound
from service.core.registry import ModelVersions


@dataclass
class _Entry:
    """The part of a ModelEntry that ModelVersions reads."""

    version: int
    ready: bool

    def is_ready(self) -> bool:
        return self.ready


def _versions(*entries: _Entry) -> ModelVersions:
    return ModelVersions("m", {entry.version: entry for entry in entries})  # type: ignore[misc]


@pytest.mark.parametrize("ready", [True, False])
def test_a_model_of_one_version_defaults_to_it_ready_or_not(ready):
    only = _Entry(3, ready)
    versions = _versions(only)
    assert versions.default() is only and versions.find("") is only and versions.find("3") is only


def test_several_versions_default_to_the_highest_ready_one_else_the_highest():
    low, mid, high = _Entry(1, True), _Entry(2, True), _Entry(5, False)
    assert _versions(low, mid, high).default() is mid  # the highest is not READY
    assert _versions(low, mid, _Entry(5, True)).default().version == 5
    assert _versions(_Entry(1, False), _Entry(2, False)).default().version == 2  # none READY: the highest


def test_find_refuses_a_version_that_is_not_served_or_not_a_number():
    versions = _versions(_Entry(1, True))
    with pytest.raises(ModelNotFound):
        versions.find("2")
    with pytest.raises(InvalidRequest, match="a model version is a number"):
        versions.find("one")
