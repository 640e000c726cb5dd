"""Warmup: a model's `model_warmup` samples run on every slot of a pool before the pool is published.

Each slot runs each sample `count` times (slot by slot, sample by sample, as Triton warms each instance), with the
inputs `engine.warmup.sample_inputs` builds once per sample; outputs are discarded. Nothing is published until every
run returned, so the model is LOADING (not ready, not listed as READY, nothing admitted to it) for the whole warmup.
It runs where the load runs: on the loading thread, holding the model's lease (a request's or a manager's) and the
cold-load guard, never a lock.

A run that fails fails the load: the error names the sample, the slot and the reason (`WarmupFailed`, a
ModelLoadError; a sample that does not fit the loaded model's inputs is a ModelConfigError), and the caller frees
the pool. A shutdown stops the warmup before its next run (and an interruptible backend's run at once): the load
then fails with ShuttingDown.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from engine.config.specs import WarmupSample
from engine.config.warmup import sample_inputs
from engine.errors import EngineError, ExecutionCancelled, InvalidInputError, ModelConfigError, ModelLoadError
from engine.interface import CancelToken, Context, ModelMetadata

from .errors import SHUTDOWN_CANCEL_REASON, ShuttingDown
from .pool import LoadTimes, SlotPool


class WarmupFailed(ModelLoadError):
    """A warmup run failed: the load fails (reason load_failed), naming the sample, the slot and the cause."""


def warm_up_pool(
    pool: SlotPool,
    samples: Sequence[WarmupSample],
    contexts: Sequence[Context] | None = None,
    *,
    cancel: CancelToken | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> LoadTimes:
    """`warm_up` on `contexts` of `pool` (every one when None), none of them lent. Raises as `warm_up`."""
    every = pool.contexts()
    chosen = every if contexts is None else list(contexts)
    position = {id(context): number for number, context in enumerate(every)}
    return warm_up(
        pool.spec.name,
        pool.metadata,
        samples,
        chosen,
        numbers=[position[id(context)] for context in chosen],  # messages name the pool's slot numbers
        streaming=pool.primary.streaming,
        cancel=cancel,
        stopping=stopping,
    )


def warm_up(
    model: str,
    metadata: ModelMetadata,
    samples: Sequence[WarmupSample],
    contexts: Sequence[Context],
    *,
    numbers: Sequence[int] | None = None,
    streaming: bool = False,
    cancel: CancelToken | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> LoadTimes:
    """Run every sample `count` times on each of `contexts` (named slot `numbers[i]` in messages; default: its
    index). Blocks for all the runs; returns their seconds and number (`load_seconds` 0: the caller knows it).

    Stops before the next run when `stopping()` is true or `cancel` fired for a shutdown (reason
    SHUTDOWN_CANCEL_REASON; a client giving up on its first request does not stop a load, nor its warmup), and a
    run of an interruptible backend is stopped when `cancel` fires for a shutdown. Raises ShuttingDown then,
    ModelConfigError for a sample that does not fit `metadata` (or whose file changed), WarmupFailed for a run that
    failed. Frees nothing: the caller closes the pool.
    """
    if not samples or not contexts:
        return LoadTimes()
    started = time.perf_counter()
    runs = 0
    stop = CancelToken()  # what the runs see: fired only for a shutdown

    def on_cancel() -> None:
        if cancel is not None and cancel.reason == SHUTDOWN_CANCEL_REASON:
            stop.cancel(SHUTDOWN_CANCEL_REASON)

    if cancel is not None:
        cancel.add_callback(on_cancel)
    try:
        prepared = [(sample, _checked_inputs(model, metadata, sample)) for sample in samples]
        for slot, context in zip(numbers or range(len(contexts)), contexts, strict=True):
            for sample, inputs in prepared:
                for run in range(sample.count):
                    if stop.cancelled or stopping():
                        raise ShuttingDown(f"model '{model}': warmup stopped: the server is shutting down")
                    _run(model, context, sample, inputs, slot, run, streaming, stop)
                    runs += 1
    finally:
        if cancel is not None:
            cancel.remove_callback(on_cancel)
    return LoadTimes(warmup_seconds=time.perf_counter() - started, warmup_runs=runs)


def _checked_inputs(model: str, metadata: ModelMetadata, sample: WarmupSample) -> dict[str, np.ndarray]:
    """The sample's arrays, checked against the loaded model's inputs as a request's would be."""
    inputs = sample_inputs(sample, metadata.max_batch_size, np.random.default_rng(0))
    datatypes = {given.name: given.datatype for given in sample.inputs}
    try:
        metadata.check_request({name: (datatypes[name], array.shape) for name, array in inputs.items()}, ())
    except InvalidInputError as error:
        raise ModelConfigError(
            f"model '{model}': warmup sample '{sample.name}' does not fit the model: {error}"
        ) from None
    return inputs


def _run(
    model: str,
    context: Context,
    sample: WarmupSample,
    inputs: dict[str, np.ndarray],
    slot: int,
    run: int,
    streaming: bool,
    stop: CancelToken,
) -> None:
    try:
        if streaming:
            for _ in context.execute_stream(inputs, (), stop):
                pass
        else:
            context.execute(inputs, (), stop)
    except ExecutionCancelled:
        if stop.cancelled:
            raise ShuttingDown(f"model '{model}': warmup stopped: the server is shutting down") from None
        raise WarmupFailed(_failure(model, sample, slot, run, "the run was cancelled")) from None
    except Exception as error:
        reason = str(error) or type(error).__name__
        cause = error if not isinstance(error, EngineError) else None  # a backend bug keeps its traceback
        raise WarmupFailed(_failure(model, sample, slot, run, reason)) from cause


def _failure(model: str, sample: WarmupSample, slot: int, run: int, reason: str) -> str:
    where = f"slot {slot} (run {run + 1} of {sample.count})"
    return f"model '{model}': warmup sample '{sample.name}' failed on {where}: {reason}"
