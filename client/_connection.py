"""Channel plumbing shared by InferenceClient and ManagementClient.

One `Connection` owns (or borrows) a channel, holds the default deadline and the metadata sent with every call,
and turns `grpc.RpcError` into `ClientError`. Nothing here knows about tensors or models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from ._security import TLSSettings, Tokens
from .errors import ClientError

# Tensors easily pass gRPC's 4 MiB default receive limit; the server enforces its own limits.
_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
)

_COMPRESSION = {
    "none": grpc.Compression.NoCompression,
    "gzip": grpc.Compression.Gzip,
    "deflate": grpc.Compression.Deflate,
}

Metadata = Sequence[tuple[str, str]]


def compression_of(value: grpc.Compression | str | None) -> grpc.Compression | None:
    """A grpc.Compression from itself, None, or a name ("gzip", "deflate", "none"). Raises ValueError."""
    if value is None or isinstance(value, grpc.Compression):
        return value
    try:
        return _COMPRESSION[value.lower()]
    except KeyError:
        raise ValueError(f"unknown compression {value!r}; use one of {', '.join(_COMPRESSION)}") from None


class Connection:
    """A channel plus the per-call settings of one client.

    A channel passed in is borrowed: `close()` leaves it open for its owner. Otherwise a channel to `address`
    (TLS when `tls` is given, else plaintext) is opened lazily by gRPC (no I/O happens here) and closed by
    `close()`. `metadata` goes with every call, plus the authorization header `tokens` picks for the call
    (see client._security): `metadata` for ordinary calls, `management_metadata` for management ones.
    """

    def __init__(
        self,
        address: str,
        *,
        channel: grpc.Channel | None,
        timeout: float | None,
        metadata: Metadata = (),
        compression: grpc.Compression | str | None = None,
        tls: TLSSettings | None = None,
        tokens: Tokens = Tokens(),  # noqa: B008 (Tokens is a frozen dataclass: one shared default is safe)
    ) -> None:
        if channel is not None and tls is not None:
            raise ValueError("TLS settings apply to a channel the client opens; a channel passed in has its own")
        self.address = address
        self.timeout = timeout
        self.metadata = tuple(metadata) + tokens.metadata()
        self.management_metadata = tuple(metadata) + tokens.metadata(management=True)
        self._owns_channel = channel is None
        if channel is None:
            channel = _open_channel(address, tls, compression_of(compression))
        self.channel = channel

    def deadline(self, timeout: float | None) -> float | None:
        """Seconds for one call: the call's own timeout, else the client's default (None: no deadline)."""
        return self.timeout if timeout is None else timeout

    def unary(
        self, method: Callable[..., Any], request: Any, timeout: float | None = None, *, management: bool = False
    ) -> Any:
        """Invoke a unary stub method; blocks until the response or the deadline. Raises ClientError.
        `management` marks a call of the management or repository protocols (it sends the management token)."""
        metadata = self.management_metadata if management else self.metadata
        try:
            return method(request, timeout=self.deadline(timeout), metadata=metadata)
        except grpc.RpcError as error:
            raise ClientError.from_rpc_error(error) from None

    def close(self) -> None:
        """Close the channel if this connection opened it; in-flight calls are cancelled. Idempotent."""
        if self._owns_channel:
            self.channel.close()


def _open_channel(address: str, tls: TLSSettings | None, compression: grpc.Compression | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS, compression=compression)
    return grpc.secure_channel(
        address, tls.credentials(), options=_CHANNEL_OPTIONS + tls.channel_options(), compression=compression
    )
