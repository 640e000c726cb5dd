"""InferenceClient: a blocking client for `inference.GRPCInferenceService` (KServe v2 / Triton) and gRPC health.

Works against slotserve and any server that speaks the protocol. Tensors are numpy arrays; BYTES tensors are
object arrays of `bytes` (str elements are sent UTF-8 encoded).

What the methods return:
- plain values: `live`, `ready`, `model_ready` (bool), `health` (status name such as "SERVING"),
  `infer` (dict of arrays), `server_metadata` (ServerMetadata), `model_metadata` (ModelMetadata),
  `repository_index` (list of RepositoryModel), `load`/`unload` (None);
- protobuf messages, whose nesting a dataclass would only copy: `model_config` (`inference.ModelConfig`) and
  `statistics` (list of `inference.ModelStatistics`). `google.protobuf.json_format.MessageToDict` turns either
  into plain data.

Every method blocks until the server answers or the deadline passes (the call's `timeout`, else the client's,
else none) and raises ClientError for any failure, including DEADLINE_EXCEEDED and UNAVAILABLE when no server
listens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from generated import model_config_pb2

from ._connection import Connection, Metadata
from ._security import INFERENCE_TOKEN_ENV, MANAGEMENT_TOKEN_ENV, PEM, Tokens, tls_settings, token_from
from ._tensors import build_request, decode_response
from .errors import ClientError

Inputs = Mapping[str, Any]


@dataclass(frozen=True)
class TensorMetadata:
    """One input or output of a model. -1 in `shape` marks a variable dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelMetadata:
    """ModelMetadataResponse as plain data."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True)
class ServerMetadata:
    """ServerMetadataResponse as plain data."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True)
class RepositoryModel:
    """One entry of RepositoryIndex. `state` is READY, LOADING, UNLOADING or UNAVAILABLE (or empty)."""

    name: str
    version: str
    state: str
    reason: str


class InferenceClient:
    """A client of one server's inference service. Use it as a context manager, or call `close()`.

    Args:
        address: "host:port" of the server; ignored when `channel` is given.
        timeout: default deadline in seconds for every call; None waits without limit.
        channel: an open channel to use instead of opening one; it is not closed by `close()`.
        compression: grpc.Compression or "gzip"/"deflate"/"none" for a channel this client opens.
        metadata: (key, value) pairs sent with every call.
        token: the inference token, sent as `authorization: Bearer <token>` (a server started with
            --inference-token needs it on every call but health probes); None reads SLOTSERVE_INFERENCE_TOKEN,
            "" sends none.
        management_token: sent instead by `load` and `unload` (repository control); None reads
            SLOTSERVE_MANAGEMENT_TOKEN, "" sends none. Either token is sent where the other is missing.
        tls: connect with TLS, trusting the system's root certificates (implied by any tls_* argument).
        tls_ca: the CA bundle that signed the server's certificate (a path, or PEM bytes).
        tls_cert, tls_key: this client's certificate and key, for servers that require one (mutual TLS).
        tls_server_name: the name to check the server's certificate against instead of the address's host.

    Opening does no network I/O (a missing server shows up as UNAVAILABLE on the first call); it reads the TLS
    files (OSError if one cannot be read). An unknown compression name, tls_cert without tls_key (or the
    reverse), or TLS settings together with `channel` raise ValueError. Thread-safe: calls from several
    threads share the channel.
    """

    def __init__(
        self,
        address: str = "127.0.0.1:8001",
        *,
        timeout: float | None = None,
        channel: grpc.Channel | None = None,
        compression: grpc.Compression | str | None = None,
        metadata: Metadata = (),
        token: str | None = None,
        management_token: str | None = None,
        tls: bool = False,
        tls_ca: PEM | None = None,
        tls_cert: PEM | None = None,
        tls_key: PEM | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        tokens = Tokens(
            inference=token_from(token, INFERENCE_TOKEN_ENV),
            management=token_from(management_token, MANAGEMENT_TOKEN_ENV),
        )
        self._connection = Connection(
            address,
            channel=channel,
            timeout=timeout,
            metadata=metadata,
            compression=compression,
            tokens=tokens,
            tls=tls_settings(tls, tls_ca, tls_cert, tls_key, tls_server_name),
        )
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._connection.channel)  # type: ignore[no-untyped-call]  # generated/ has no stubs for its _grpc modules: the stub's calls are typed at each use below
        self._health = health_pb2_grpc.HealthStub(self._connection.channel)

    @property
    def channel(self) -> grpc.Channel:
        """The channel, for sharing with a ManagementClient."""
        return self._connection.channel

    def close(self) -> None:
        """Close the channel if this client opened it (in-flight calls are cancelled). Idempotent."""
        self._connection.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- inference -------------------------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        inputs: Inputs,
        outputs: list[str] | None = None,
        *,
        version: str = "",
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one inference and return its outputs by name.

        `inputs` maps names to arrays (or anything np.asarray accepts); the datatype follows the dtype
        (float32 is FP32, object/str/bytes arrays are BYTES). `outputs` None asks for every output.
        `parameters` become request parameters (bool, int, float, str); slotserve reads `timeout`
        (microseconds, may only shorten the model's admission timeout). `timeout` here is the gRPC deadline in
        seconds. Raw outputs are read-only views over the response. Raises ClientError.
        """
        request = build_request(model, inputs, outputs, version=version, request_id=request_id, parameters=parameters)
        return decode_response(self._connection.unary(self._stub.ModelInfer, request, timeout))

    def stream_infer(
        self,
        model: str,
        requests: Iterable[Inputs],
        outputs: list[str] | None = None,
        *,
        version: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Iterator[dict[str, np.ndarray] | ClientError]:
        """Send each input dict of `requests` on one ModelStreamInfer call; yield each response as it arrives.

        A request the server refuses yields a ClientError item (code "UNKNOWN", `request_id` set to the
        request's index as a string when the server echoes it) and the stream goes on. Lazy: nothing is sent
        until iteration starts, and `requests` is consumed by gRPC's thread as the call proceeds. `timeout`
        bounds the whole stream. Raises ClientError when the call itself fails; an input that cannot be encoded
        (or an exception from `requests`) ends the sending side and is raised after the responses to the
        requests before it. Leaving the loop early cancels the call.
        """
        failures: list[BaseException] = []
        messages = _stream_requests(model, requests, outputs, version, parameters, failures)
        call = self._stub.ModelStreamInfer(
            messages, timeout=self._connection.deadline(timeout), metadata=self._connection.metadata
        )
        try:
            for response in call:
                yield _stream_item(response)
        except grpc.RpcError as error:
            raise ClientError.from_rpc_error(error) from None
        finally:
            call.cancel()  # a no-op after the server finished; stops the call when the caller breaks early
        if failures:
            raise failures[0]

    # ---- health ----------------------------------------------------------------------------------------------

    def live(self, *, timeout: float | None = None) -> bool:
        """ServerLive. Raises ClientError (UNAVAILABLE when nothing listens)."""
        response: pb.ServerLiveResponse = self._connection.unary(self._stub.ServerLive, pb.ServerLiveRequest(), timeout)
        return response.live

    def ready(self, *, timeout: float | None = None) -> bool:
        """ServerReady. Raises ClientError."""
        response: pb.ServerReadyResponse = self._connection.unary(
            self._stub.ServerReady, pb.ServerReadyRequest(), timeout
        )
        return response.ready

    def model_ready(self, model: str, version: str = "", *, timeout: float | None = None) -> bool:
        """ModelReady. Raises ClientError (a server may answer NOT_FOUND for an unknown model)."""
        request = pb.ModelReadyRequest(name=model, version=version)
        response: pb.ModelReadyResponse = self._connection.unary(self._stub.ModelReady, request, timeout)
        return response.ready

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """grpc.health.v1 Health/Check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN".

        Raises ClientError (NOT_FOUND for a service the server does not know, UNIMPLEMENTED without a health
        service).
        """
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._connection.unary(self._health.Check, request, timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))  # grpc_health: untyped

    # ---- metadata, configuration, statistics -----------------------------------------------------------------

    def server_metadata(self, *, timeout: float | None = None) -> ServerMetadata:
        """ServerMetadata. Raises ClientError."""
        response = self._connection.unary(self._stub.ServerMetadata, pb.ServerMetadataRequest(), timeout)
        return ServerMetadata(response.name, response.version, tuple(response.extensions))

    def model_metadata(self, model: str, version: str = "", *, timeout: float | None = None) -> ModelMetadata:
        """ModelMetadata. Raises ClientError."""
        request = pb.ModelMetadataRequest(name=model, version=version)
        response = self._connection.unary(self._stub.ModelMetadata, request, timeout)
        return ModelMetadata(
            response.name,
            tuple(response.versions),
            response.platform,
            _tensor_metadata(response.inputs),
            _tensor_metadata(response.outputs),
        )

    def model_config(
        self, model: str, version: str = "", *, timeout: float | None = None
    ) -> model_config_pb2.ModelConfig:
        """ModelConfig, as the `inference.ModelConfig` message. Raises ClientError."""
        request = pb.ModelConfigRequest(name=model, version=version)
        response: pb.ModelConfigResponse = self._connection.unary(self._stub.ModelConfig, request, timeout)
        return response.config

    def statistics(
        self, model: str = "", version: str = "", *, timeout: float | None = None
    ) -> list[pb.ModelStatistics]:
        """ModelStatistics messages; an empty `model` asks for every model. Raises ClientError."""
        request = pb.ModelStatisticsRequest(name=model, version=version)
        return list(self._connection.unary(self._stub.ModelStatistics, request, timeout).model_stats)

    # ---- repository ------------------------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False, *, timeout: float | None = None) -> list[RepositoryModel]:
        """RepositoryIndex; `ready_only` lists only ready models. Sends the management token (a server started with
        one asks for it). Raises ClientError."""
        response = self._connection.unary(
            self._stub.RepositoryIndex, pb.RepositoryIndexRequest(ready=ready_only), timeout, management=True
        )
        return [RepositoryModel(m.name, m.version, m.state, m.reason) for m in response.models]

    def load(self, model: str, config: str | Mapping[str, Any] | None = None, *, timeout: float | None = None) -> None:
        """RepositoryModelLoad; blocks until the model is loaded (or refused).

        `config` (a JSON string, or a dict serialized to JSON) replaces the repository's config.pbtxt for this
        load. Raises ClientError (slotserve: INVALID_ARGUMENT for a bad configuration, UNAVAILABLE with reason
        `server_busy`, `residency_limit` or `memory_limit` when it cannot load now).
        """
        request = pb.RepositoryModelLoadRequest(model_name=model)
        if config is not None:
            text = config if isinstance(config, str) else json.dumps(config)
            request.parameters["config"].string_param = text
        self._connection.unary(self._stub.RepositoryModelLoad, request, timeout, management=True)

    def unload(self, model: str, *, timeout: float | None = None) -> None:
        """RepositoryModelUnload; blocks until the work admitted before it drained. Raises ClientError."""
        request = pb.RepositoryModelUnloadRequest(model_name=model)
        self._connection.unary(self._stub.RepositoryModelUnload, request, timeout, management=True)


def _tensor_metadata(tensors: Iterable[pb.ModelMetadataResponse.TensorMetadata]) -> tuple[TensorMetadata, ...]:
    return tuple(TensorMetadata(t.name, t.datatype, tuple(t.shape)) for t in tensors)


def _stream_requests(
    model: str,
    requests: Iterable[Inputs],
    outputs: list[str] | None,
    version: str,
    parameters: Mapping[str, Any] | None,
    failures: list[BaseException],
) -> Iterator[pb.ModelInferRequest]:
    """The request messages of a stream. An exception here would be swallowed by gRPC's sending thread (the
    call just gets cancelled), so it is kept in `failures` for the caller's thread and the sending side ends."""
    try:
        for index, inputs in enumerate(requests):
            yield build_request(model, inputs, outputs, version=version, request_id=str(index), parameters=parameters)
    except Exception as error:  # noqa: BLE001 - re-raised in the caller's thread by stream_infer
        failures.append(error)


def _stream_item(response: pb.ModelStreamInferResponse) -> dict[str, np.ndarray] | ClientError:
    if response.error_message:
        request_id = response.infer_response.id if response.HasField("infer_response") else ""
        return ClientError("UNKNOWN", response.error_message, request_id=request_id or None)
    try:
        return decode_response(response.infer_response)
    except ClientError as error:
        # One undecodable response is that request's failure, not the stream's.
        error.request_id = response.infer_response.id or None
        return error
