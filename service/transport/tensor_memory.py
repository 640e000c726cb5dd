"""The memory request tensors take, bounded per request and for all requests in flight together.

Before a request's inputs are decoded, the dataplane estimates from the message alone what decoding and running
them takes (`tensors.decoded_bytes`: nbytes for fixed-size datatypes; for BYTES, BYTES_COPIES times
BYTES_ELEMENT_COST per element plus its contents) and reserves that much here. A request whose estimate exceeds
`--max-request-tensor-bytes`, or would take the requests in flight past `--max-inflight-tensor-bytes`, is
refused at once with TensorMemoryLimit (RESOURCE_EXHAUSTED, reason tensor_memory_limit) naming the limit: nothing
was decoded, and no request waits for memory. Once the run has produced its outputs, their size is added to the
reservation (counted, never refused: that memory is already taken), so later requests see it. The reservation is
released when the request ends, whatever the end: answered (its response serialized), refused, failed,
cancelled, or a stream closed.

Why a bound is needed: a BYTES element becomes a Python bytes object behind a pointer (about 56 bytes for a
short one), so 6 bytes on the wire (a 4-byte length and 2 bytes) take about 10 times that decoded; without a
bound one 1 GiB message of short strings would take over 10 GiB. And the engines copy BYTES tensors while they
run: ONNX Runtime holds the input and the output as C++ strings and returns the output as str objects (with the
server's decoded input, five copies of each element at its peak); a python model's worker decodes its own copy
and encodes its output. So a BYTES element is reserved BYTES_COPIES times, measured so that the reservation
bounds the peak within 1.5x (docs/model-repository.md has the figures).

Plain Python: no gRPC, no protobuf. One lock, a leaf (nothing is taken under it), held for arithmetic only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..core.errors import ServiceError, never_retried

# --max-request-tensor-bytes: the default message limit (1 GiB), so every fixed-size tensor a default message
# can carry is admitted; BYTES inputs of about 4.6 million short elements (some 27 MiB on the wire) are not.
DEFAULT_REQUEST_BYTES = 1 << 30
# --max-inflight-tensor-bytes: four such requests at once.
DEFAULT_IN_FLIGHT_BYTES = 4 << 30
# What a decoded BYTES element is reserved for: itself and three copies an engine makes of it while it runs
# (ONNX Runtime, an identity of 2 million 2-byte strings: a peak of 202 bytes an element over 58 decoded, 3.5
# times; of 20-byte strings 394 over 76, 5.2 times; 1000-byte ones 5340 over 1056, 5.1 times; the run's output
# is counted besides, when it exists).
BYTES_COPIES = 4
REQUEST_FLAG = "--max-request-tensor-bytes"
IN_FLIGHT_FLAG = "--max-inflight-tensor-bytes"


class TensorMemoryLimit(ServiceError):
    """Decoding the request's tensors would exceed a tensor memory limit (RESOURCE_EXHAUSTED, reason
    tensor_memory_limit). The message names the limit and the numbers."""

    error_reason = "tensor_memory_limit"


@dataclass(frozen=True)
class TensorMemoryStatistics:
    in_flight_bytes: int  # reserved by requests not yet finished
    requests: int  # requests holding a reservation now
    peak_bytes: int  # the most in flight at once since the server started
    refused_request: int  # requests refused by the per-request limit
    refused_in_flight: int  # requests refused because the requests in flight held too much


class TensorMemory:
    """The account of tensor memory held by requests in flight. `request_limit` and `in_flight_limit` are bytes;
    0 means no limit. Thread-safe; `reserve` never blocks."""

    def __init__(self, request_limit: int = 0, in_flight_limit: int = 0) -> None:
        if request_limit < 0 or in_flight_limit < 0:
            raise ValueError("tensor memory limits are >= 0 (0: no limit)")
        self.request_limit = request_limit
        self.in_flight_limit = in_flight_limit
        self._lock = threading.Lock()  # guards: _in_flight, _requests, _peak, _refused_request, _refused_in_flight
        self._in_flight = 0
        self._requests = 0
        self._peak = 0
        self._refused_request = 0
        self._refused_in_flight = 0

    def reserve(self, nbytes: int) -> Reservation:
        """Reserve `nbytes` for one request, or raise TensorMemoryLimit (reserving nothing) when it exceeds the
        per-request limit, or the in-flight limit together with what the requests in flight hold. The caller
        must `release()` the reservation when the request ends."""
        request_limit, in_flight_limit = self.request_limit, self.in_flight_limit
        if request_limit and nbytes > request_limit:
            with self._lock:
                self._refused_request += 1
            raise never_retried(
                TensorMemoryLimit(f"{_needs(nbytes)}, more than {REQUEST_FLAG} ({request_limit}) allows one request")
            )
        with self._lock:
            held = self._in_flight
            if not in_flight_limit or held + nbytes <= in_flight_limit:
                self._in_flight = held = held + nbytes
                self._requests += 1
                if held > self._peak:
                    self._peak = held
                return Reservation(self, nbytes)
            self._refused_in_flight += 1
        if nbytes > in_flight_limit:
            raise never_retried(
                TensorMemoryLimit(
                    f"{_needs(nbytes)}, more than {IN_FLIGHT_FLAG} ({in_flight_limit}) allows all requests together"
                )
            )
        raise TensorMemoryLimit(
            f"{_needs(nbytes)}, and the requests in flight hold {held} of the {in_flight_limit} "
            f"bytes {IN_FLIGHT_FLAG} allows them together; retry when fewer are running"
        )

    def _grow(self, nbytes: int) -> None:
        with self._lock:  # (once per answered request: the arithmetic inline, no helper call)
            self._in_flight = held = self._in_flight + nbytes
            if held > self._peak:
                self._peak = held

    def _release(self, nbytes: int) -> None:
        with self._lock:  # (once per request, inline; a release never raises the peak)
            self._in_flight -= nbytes
            self._requests -= 1

    def statistics(self) -> TensorMemoryStatistics:
        with self._lock:
            return TensorMemoryStatistics(
                self._in_flight, self._requests, self._peak, self._refused_request, self._refused_in_flight
            )


def _needs(nbytes: int) -> str:
    return f"the request's tensors take about {nbytes} bytes decoded"


class Reservation:
    """One request's share of the account. Used by the request's own thread only (a stream's generator is resumed
    by one thread at a time), so it needs no lock of its own; the account's lock orders the figures."""

    __slots__ = ("_account", "_inputs", "_outputs", "_released")

    def __init__(self, account: TensorMemory, nbytes: int) -> None:
        self._account = account
        self._inputs = nbytes
        self._outputs = 0
        self._released = False

    @property
    def nbytes(self) -> int:
        return self._inputs + self._outputs

    def count_outputs(self, nbytes: int) -> None:
        """The outputs now held take `nbytes` (they replace the outputs counted before: a streaming model's
        earlier responses are sent). Never refused: the memory is already taken. No-op once released."""
        if self._released or nbytes == self._outputs:
            return
        change, self._outputs = nbytes - self._outputs, nbytes
        self._account._grow(change)

    def release(self) -> None:
        """Give the request's bytes back. Idempotent."""
        if not self._released:
            self._released = True
            self._account._release(self._inputs + self._outputs)
