"""A tensor read out of a segment (engine/python/transport.py `read`): the model's view of an input is read-only and
keeps its memory mapped while the model holds it; the server's copy of an output is its own."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from engine.python import transport


@pytest.fixture
def laid_out():
    """A segment holding INT32 [2, 3] (0..5) and an empty FP32 [0, 4] at the end, and their descriptors."""
    segment = transport.Segment.create(transport.CONTROL_BYTES + 64)
    layout = transport.Layout(transport.CONTROL_BYTES)
    ints = layout.plan("X", np.arange(6, dtype=np.int32).reshape(2, 3), "INT32")
    empty = layout.plan("E", np.zeros((0, 4), dtype=np.float32), "FP32")
    layout.write(segment)
    yield segment, ints, empty
    segment.unlink()
    segment.close()


def test_a_view_is_read_only(laid_out):
    segment, ints, _ = laid_out
    view = transport.read(segment, ints, copy=False)
    assert view.tolist() == [[0, 1, 2], [3, 4, 5]] and view.dtype == np.int32
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0] = 7
    assert segment.view[ints.offset] == 0  # nothing was written


def test_a_view_kept_past_the_segments_close_keeps_its_memory(laid_out):
    segment, ints, _ = laid_out
    view = transport.read(segment, ints, copy=False)
    segment.close()  # the mapping stays while the view holds it (left to the garbage collector)
    gc.collect()
    assert view.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_copy_is_the_readers_own(laid_out):
    segment, ints, empty = laid_out
    copied = transport.read(segment, ints, copy=True)
    segment.view[ints.offset : ints.offset + ints.nbytes] = bytes(ints.nbytes)
    assert copied.tolist() == [[0, 1, 2], [3, 4, 5]] and copied.flags.writeable and copied.flags.owndata
    for copy in (True, False):
        assert transport.read(segment, empty, copy=copy).shape == (0, 4)
