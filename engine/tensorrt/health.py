"""Whether a GPU can still be used after a sticky CUDA error, and when it may be reset.

A sticky error (an illegal address in a kernel, a device-side assert, ...; cuda.STICKY_ERRORS) corrupts the
process's CUDA context on that device: every later CUDA call there fails with it, for every model on the device.
So the first slot to see one marks the device failed here; from then on every slot of every model on that device
refuses requests at once with DeviceFailedError (the server retires those models), and no new engine is built on
the broken context.

Recovery: once no model of this backend holds anything on the device (every engine closed), the next load resets
the device (cudaDeviceReset destroys the old context; the next call makes a fresh one), checks that the fresh
context works, and builds there. NVIDIA documents that only a new process is sure to clear a sticky error, so a
device whose fresh context still fails stays failed and the load says to restart the server.

Locking: `DeviceHealth._lock` guards the fault and the holders; the recovery (a reset and a small probe) runs under
it so that no load starts on the device meanwhile. Nothing else is locked inside it.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DeviceFailedError, ModelLoadError

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceFault:
    error: str  # the CUDA error's name, e.g. cudaErrorIllegalAddress
    model: str  # the model whose slot saw it first


class DeviceHealth:
    """One CUDA device as one backend uses it: its fault (if any) and the models holding objects on it."""

    def __init__(self, device: int) -> None:
        self.device = device
        self._lock = threading.Lock()  # guards: _fault, _holders
        self._fault: DeviceFault | None = None
        self._holders: collections.Counter[str] = collections.Counter()

    @property
    def fault(self) -> DeviceFault | None:
        return self._fault

    def refusal(self, model: str) -> DeviceFailedError:
        """The error for a request of `model` on the failed device."""
        fault = self._fault
        assert fault is not None
        return DeviceFailedError(
            f"model '{model}': GPU {self.device} failed ({fault.error}, first seen by model '{fault.model}'), so its "
            "CUDA context is unusable; the model was taken out of service and is rebuilt on a fresh context by the "
            "next request or load once every model on that GPU is unloaded"
        )

    def check(self, model: str) -> None:
        """Raise DeviceFailedError if the device failed. One attribute read when it did not."""
        if self._fault is not None:
            raise self.refusal(model)

    def fail(self, error: str, model: str) -> DeviceFailedError:
        """Record a sticky error seen by `model` (the first one is kept) and return the error for its request."""
        with self._lock:
            first = self._fault is None
            if first:
                self._fault = DeviceFault(error, model)
        if first:
            _LOG.error(
                "GPU %d failed with %s in model '%s': every model on it is refused until they are all "
                "unloaded and the device is reset",
                self.device,
                error,
                model,
            )
        return self.refusal(model)

    def enter(self, model: str, recover: Callable[[], None]) -> None:
        """`model` starts holding objects on the device (a load begins). On a failed device, `recover` (reset the
        device and check the fresh context) runs first if nothing holds the device any more; raises ModelLoadError
        naming the models that still do, or what `recover` raised."""
        with self._lock:
            fault = self._fault
            if fault is not None:
                if self._holders:
                    raise ModelLoadError(
                        f"model '{model}': GPU {self.device} failed ({fault.error}, first seen by model "
                        f"'{fault.model}'); it is reset once every model on it is unloaded, and these are still "
                        f"loaded: {', '.join(sorted(self._holders))}"
                    )
                recover()
                _LOG.warning(
                    "GPU %d was reset after %s; models are rebuilt on a fresh CUDA context (NVIDIA documents "
                    "that only a new process is sure to clear such an error: restart the server if errors "
                    "recur)",
                    self.device,
                    fault.error,
                )
                self._fault = None
            self._holders[model] += 1

    def leave(self, model: str) -> None:
        """`model` no longer holds anything on the device (its engine is closed, or its load failed)."""
        with self._lock:
            self._holders[model] -= 1
            if self._holders[model] <= 0:
                del self._holders[model]
