"""A cancel never reaches another request's run (issue 12, item 4). A CancelToken runs its callbacks after it
lets go of its lock, so a callback removed at the end of one lease can still arrive later, while the slot runs
the next lease's request. Real ONNX Runtime on a real (slow) model; the interleaving is forced through a
blocking earlier callback on the first token and a hook at the start of each run."""

from __future__ import annotations

import threading

import numpy as np

from engine.config.repository import ModelRepository
from engine.interface import CancelToken
from engine.onnxruntime_backend import OnnxRuntimeBackend
from tests.shutdown.harness import slow_rows, write_slow_onnx_model

WAIT = 20.0


def test_a_late_cancel_of_the_previous_lease_does_not_terminate_the_next_run_on_the_slot(tmp_path):
    write_slow_onnx_model(tmp_path, "slow", nodes=300)
    model = OnnxRuntimeBackend().load(ModelRepository(tmp_path).read("slow"))
    context = model.create_context()  # one slot, lent to two leases in turn
    real_run = model.run

    # Lease 1: its client cancels right at the end of the run. The token swaps out its callback list (which
    # holds the slot's terminate callback) and runs an earlier callback first, which blocks here.
    first = CancelToken()
    swapped, go_on = threading.Event(), threading.Event()
    first.add_callback(lambda: (swapped.set(), go_on.wait(WAIT)))
    canceller = threading.Thread(target=first.cancel, args=("client",))

    def run_while_the_client_cancels(names, feed, options):
        canceller.start()
        assert swapped.wait(WAIT)
        return real_run(names, feed, options)

    model.run = run_while_the_client_cancels
    first_output = context.execute({"INPUT0": slow_rows(1)}, [], first)["OUTPUT0"]
    assert first_output.shape == (1, 512)

    # Lease 2: another client, never cancelled, on the same slot. Once its run has begun, lease 1's terminate
    # callback, still on its way, is let go.
    second = CancelToken()
    in_run = threading.Event()

    def run_and_signal(names, feed, options):
        in_run.set()
        return real_run(names, feed, options)

    model.run = run_and_signal
    results: list = []
    runner = threading.Thread(target=lambda: results.append(_outcome(context, second)))
    runner.start()
    assert in_run.wait(WAIT)
    go_on.set()
    canceller.join(WAIT)
    runner.join(WAIT)
    assert not second.cancelled
    output = results[0]
    assert not isinstance(output, Exception), f"the never-cancelled request failed: {output!r}"
    np.testing.assert_allclose(output[:1], first_output, rtol=1e-6)  # the same rows give the same result


def _outcome(context, token):
    try:
        return context.execute({"INPUT0": slow_rows(64)}, [], token)["OUTPUT0"]
    except Exception as error:  # returned for the assertion to name
        return error
