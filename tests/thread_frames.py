"""`current_frames()`: sys._current_frames() without CPython 3.11's deadlock.

sys._current_frames() holds the interpreter's thread-list lock while it builds its dictionary; a garbage collection
that starts there runs Python callbacks (a WeakSet's `_remove`), which may give the GIL to another thread, and a
thread that then starts or ends waits for that same lock: neither moves again (CPython gh-106883, fixed after
3.11). tests/integration/server/test_stalled_calls.py hung so in a clean-clone `make test`, every thread asleep.
Collection is held off for the call."""

from __future__ import annotations

import gc
import sys
from types import FrameType


def current_frames() -> dict[int, FrameType]:
    """Each thread's current frame, by thread id (as sys._current_frames), with the collector off meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if enabled:
            gc.enable()
