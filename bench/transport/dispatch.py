"""Design 2's scheduling, shared by the grpc.aio front end and the multi-process model process: a call whose
model is known to be fast runs inline on the event loop; any other call runs on a slot thread, and finished
thread calls are handed back to the loop in batches, one wake-up per loop turn however many finished.

"Known to be fast": the model's own statistics (ModelStatistics' compute_infer) count at least `min_runs` runs
with a mean under `threshold_us`. Until then its calls go to threads, which measures them. A model call also goes
to a thread while another call of the same model is on a thread: then admission could make an inline call wait
for a slot, and a wait on the loop would stop every other call. Control calls (metadata, statistics, readiness)
always run inline: they never wait.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from concurrent.futures import ThreadPoolExecutor

from . import adapter


class Dispatcher:
    """Runs calls inline or on slot threads (see the module docstring). Use from the loop's thread only, except
    `_work`, which runs on the slot threads."""

    def __init__(self, loop, core, methods, *, threshold_us: float, threads: int, min_runs: int = 20) -> None:
        self._loop = loop
        self._core = core
        self.methods = methods
        self._threshold_us = threshold_us
        self._min_runs = min_runs
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="slot")
        self._fast: set[str] = set()  # models measured fast (never unlearned in this prototype)
        self._on_threads: collections.Counter = collections.Counter()  # loop thread only
        self._finished: collections.deque = collections.deque()
        self._lock = threading.Lock()  # guards: _finished, _wake_scheduled
        self._wake_scheduled = False
        self.inline_calls = 0
        self.thread_calls = 0
        self.wakeups = 0

    def inline(self, name: str, request) -> bool:
        """Whether this call runs on the loop (see the module docstring)."""
        if name != "ModelInfer":
            return True
        model = adapter.model_name(request)
        if self._on_threads[model]:
            return False
        if model in self._fast:
            return True
        runs, mean_us = adapter.mean_infer_us(self._core, model)
        if runs >= self._min_runs and mean_us < self._threshold_us:
            self._fast.add(model)
            return True
        return False

    def run_inline(self, name: str, request, context: adapter.ShimContext) -> bytes:
        self.inline_calls += 1
        return adapter.call(self.methods[name], request, context)

    async def run_on_thread(self, name: str, request, context: adapter.ShimContext) -> bytes:
        model = adapter.model_name(request)
        self._on_threads[model] += 1
        self.thread_calls += 1
        future = self._loop.create_future()
        try:
            self._pool.submit(self._work, future, self.methods[name], request, context)
            return await future
        finally:
            self._on_threads[model] -= 1

    async def run(self, name: str, request, context: adapter.ShimContext) -> bytes:
        if self.inline(name, request):
            return self.run_inline(name, request, context)
        return await self.run_on_thread(name, request, context)

    def _work(self, future, method, request, context) -> None:
        """On a slot thread: run the call, queue its result, and wake the loop only if no wake-up is pending."""
        try:
            outcome = (adapter.call(method, request, context), None)
        except BaseException as error:  # handed to the awaiting call
            outcome = (None, error)
        with self._lock:
            self._finished.append((future, outcome))
            wake, self._wake_scheduled = not self._wake_scheduled, True
        if wake:
            self._loop.call_soon_threadsafe(self._hand_back)

    def _hand_back(self) -> None:
        """On the loop: resolve every call finished since the last wake-up."""
        with self._lock:
            finished = list(self._finished)
            self._finished.clear()
            self._wake_scheduled = False
        self.wakeups += 1
        for future, (result, error) in finished:
            if future.done():  # the call was cancelled meanwhile
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def loop_deadline(context) -> float | None:
    """A grpc.aio call's deadline on the monotonic clock (None: none, or beyond a year)."""
    import time

    remaining = context.time_remaining()
    if remaining is None or remaining > 365 * 24 * 3600.0:
        return None
    return time.monotonic() + remaining


def run_until_signalled(main) -> None:
    """asyncio.run(main(stop)) where `stop` is an Event set by SIGTERM or SIGINT."""
    import signal

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await main(stop)

    asyncio.run(runner())
