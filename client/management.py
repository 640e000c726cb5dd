"""ManagementClient: a blocking client for `slotserve.management.v1.ModelManagement`.

Register, reconfigure and unload models and read their status. Statuses come back as the frozen dataclass
ModelStatus, whose `max_parallel_slots` and `memory_bytes` are None when the server left them unset (the model
is not loaded). Every method blocks until the server answers or the deadline passes and raises ClientError:
PERMISSION_DENIED without the server's --allow-management, UNAUTHENTICATED for a missing or wrong token,
NOT_FOUND for an unknown id, UNAVAILABLE with reason `server_busy`, `residency_limit` or `memory_limit`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from generated import management_pb2 as pb
from generated import management_pb2_grpc as pb_grpc

from ._connection import Connection, Metadata
from ._security import INFERENCE_TOKEN_ENV, MANAGEMENT_TOKEN_ENV, PEM, Tokens, tls_settings, token_from

TOKEN_ENV = MANAGEMENT_TOKEN_ENV
_STATE_PREFIX = "MODEL_STATE_"


@dataclass(frozen=True)
class ModelStatus:
    """One observation of a model (the ModelStatus message as plain data).

    `state` is the ModelState name without its prefix: "UNLOADED", "LOADING", "READY", "RECONFIGURING",
    "UNLOADING" (or "UNSPECIFIED"). `admission_timeout_seconds` 0 waits without limit.
    """

    model_id: str
    loaded: bool
    state: str
    slots: int
    active_slots: int
    queued_requests: int
    max_parallel_slots: int | None
    backend: str
    last_error: str
    source: str
    admission_timeout_seconds: float
    version: str
    memory_bytes: int | None
    batching: Batching | None = None  # dynamic batching settings; None: one request per engine call

    @classmethod
    def from_proto(cls, message: pb.ModelStatus) -> ModelStatus:
        """The dataclass for a ModelStatus message; unset optional fields become None."""
        return cls(
            model_id=message.model_id,
            loaded=message.loaded,
            state=_state_name(message.state),
            slots=message.slots,
            active_slots=message.active_slots,
            queued_requests=message.queued_requests,
            max_parallel_slots=message.max_parallel_slots if message.HasField("max_parallel_slots") else None,
            backend=message.backend,
            last_error=message.last_error,
            source=message.source,
            admission_timeout_seconds=message.admission_timeout_seconds,
            version=message.version,
            memory_bytes=message.memory_bytes if message.HasField("memory_bytes") else None,
            batching=Batching.from_proto(message.batching) if message.HasField("batching") else None,
        )


@dataclass(frozen=True)
class Batching:
    """A model's dynamic batching settings (the DynamicBatching message as plain data)."""

    max_batch_size: int
    max_queue_delay_microseconds: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_size: int  # 0: the server's --max-queue
    allow_timeout_override: bool

    @classmethod
    def from_proto(cls, message: pb.DynamicBatching) -> Batching:
        return cls(
            message.max_batch_size,
            message.max_queue_delay_microseconds,
            tuple(message.preferred_batch_sizes),
            message.max_queue_size,
            message.allow_timeout_override,
        )


def _state_name(value: int) -> str:
    try:
        name = pb.ModelState.Name(value)
    except ValueError:
        # A newer server may add states; show the number rather than fail the whole call.
        return str(value)
    return name.removeprefix(_STATE_PREFIX)


class ManagementClient:
    """A client of one server's management service. Use it as a context manager, or call `close()`.

    Args:
        address: "host:port"; ignored when `channel` is given (share InferenceClient.channel this way).
        timeout: default deadline in seconds for every call; None waits without limit (RegisterModel waits in
            the model's queue, UnloadModels waits for in-flight work to drain).
        channel: an open channel to use; it is not closed by `close()`.
        token: the management token, sent as `authorization: Bearer <token>`; None reads
            SLOTSERVE_MANAGEMENT_TOKEN, "" sends none.
        metadata: further (key, value) pairs sent with every call.
        inference_token: sent by the status calls (`list`, `get`) when the server was started with
            --inference-token; None reads SLOTSERVE_INFERENCE_TOKEN, "" sends none. Either token is sent where
            the other is missing (the server takes the management token for status calls too).
        tls, tls_ca, tls_cert, tls_key, tls_server_name: TLS, as for InferenceClient.
    """

    def __init__(
        self,
        address: str = "127.0.0.1:8001",
        *,
        timeout: float | None = None,
        channel: grpc.Channel | None = None,
        token: str | None = None,
        metadata: Metadata = (),
        inference_token: str | None = None,
        tls: bool = False,
        tls_ca: PEM | None = None,
        tls_cert: PEM | None = None,
        tls_key: PEM | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        tokens = Tokens(
            inference=token_from(inference_token, INFERENCE_TOKEN_ENV),
            management=token_from(token, MANAGEMENT_TOKEN_ENV),
        )
        self._connection = Connection(
            address,
            channel=channel,
            timeout=timeout,
            metadata=metadata,
            tokens=tokens,
            tls=tls_settings(tls, tls_ca, tls_cert, tls_key, tls_server_name),
        )
        self._stub = pb_grpc.ModelManagementStub(self._connection.channel)  # type: ignore[no-untyped-call]  # generated/ has no stubs for its _grpc modules

    def close(self) -> None:
        """Close the channel if this client opened it. Idempotent."""
        self._connection.close()

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def register(
        self,
        model_id: str,
        *,
        source: str = "",
        backend: str = "",
        options: Mapping[str, str] | None = None,
        slots: int | None = None,
        admission_timeout: float | None = None,
        config_json: str | Mapping[str, Any] = "",
        timeout: float | None = None,
    ) -> ModelStatus:
        """RegisterModel: register a new id or reconfigure an existing one, then load it; the model's status.

        Blocks while the server waits for an exclusive lease and loads. `slots`/`admission_timeout` None leave
        the server's choice; `config_json` (JSON text or a dict) replaces config.pbtxt. Raises ClientError.
        """
        request = pb.RegisterModelRequest(
            model_id=model_id,
            source=source,
            backend=backend,
            options={key: str(value) for key, value in (options or {}).items()},
            config_json=_json_text(config_json),
        )
        if slots is not None:
            request.slots = slots
        if admission_timeout is not None:
            request.admission_timeout_seconds = admission_timeout
        response = self._connection.unary(self._stub.RegisterModel, request, timeout, management=True)
        return ModelStatus.from_proto(response)

    def unload(self, model_id: str, *, timeout: float | None = None) -> ModelStatus:
        """UnloadModel: unload one model after its admitted work drains (idempotent). Raises ClientError."""
        request = pb.UnloadModelRequest(model_id=model_id)
        response = self._connection.unary(self._stub.UnloadModel, request, timeout, management=True)
        return ModelStatus.from_proto(response)

    def unload_many(
        self,
        model_ids: Iterable[str] = (),
        *,
        all: bool = False,  # noqa: A002 - the proto's name
        timeout: float | None = None,
    ) -> tuple[list[str], list[str]]:
        """UnloadModels: (unloaded ids, ids not registered). `all` selects every registered model.

        Blocks until every selected model drained, without a server-side limit. Raises ClientError.
        """
        request = pb.UnloadModelsRequest(model_ids=list(model_ids), all=all)
        response = self._connection.unary(self._stub.UnloadModels, request, timeout, management=True)
        return list(response.unloaded), list(response.not_found)

    def list(self, *, timeout: float | None = None) -> list[ModelStatus]:
        """ListModels: the status of every registered model (with the management token, which a server started
        with one asks for; without --allow-management too). Raises ClientError."""
        response = self._connection.unary(self._stub.ListModels, pb.ListModelsRequest(), timeout, management=True)
        return [ModelStatus.from_proto(model) for model in response.models]

    def get(self, model_id: str, *, timeout: float | None = None) -> ModelStatus:
        """GetModel: one model's status. Raises ClientError (NOT_FOUND for an unknown id)."""
        request = pb.GetModelRequest(model_id=model_id)
        return ModelStatus.from_proto(self._connection.unary(self._stub.GetModel, request, timeout, management=True))


def _json_text(config: str | Mapping[str, Any]) -> str:
    return config if isinstance(config, str) else json.dumps(config)
