"""Test doubles: engines that exist to make tests deterministic, not to serve.

- `engine.testing.fixture`: the fixture backend (`backend: "fixture"`), whose gates hold, fail or hang a load,
  a run or a teardown at the moment a test chooses;
- `engine.testing.tensorrt_double`: a GPU-less stand-in for the TensorRT and CUDA modules, as strict as the
  libraries, that the TensorRT backend's tests run on.

A production server never loads this package: `python -m service` registers the fixture backend only with
`--enable-test-backends`, and the in-process harness (`service.testing`) registers it for the tests it starts.
The package is left out of the wheel (pyproject.toml); it is importable from a source checkout.
"""

from __future__ import annotations

from engine.interface import Backend

TEST_BACKENDS = ("fixture",)


def test_backends() -> dict[str, Backend]:
    """The backends `--enable-test-backends` adds, by name (new instances, no shared state)."""
    from .fixture import FixtureBackend

    return {"fixture": FixtureBackend()}
