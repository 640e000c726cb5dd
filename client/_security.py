"""Client-side bearer tokens and TLS, shared by InferenceClient, ManagementClient and the CLI.

Tokens: each call sends at most one `authorization: Bearer <token>` header. A management call (register,
unload, repository load/unload) sends the management token if the client has one, else the inference token;
any other call sends the inference token if it has one, else the management token. A slotserve server accepts
the management token wherever the inference token is needed, so one token serves an operator's tools.

TLS: `tls_ca` (the CA bundle that signed the server's certificate; default: the system's roots), and for
mutual TLS `tls_cert` + `tls_key` (the client's own certificate and key). Each is a file path or the PEM bytes
themselves. `tls_server_name` overrides the name checked against the server's certificate (for tests, or for
dialing an IP address the certificate does not name).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

MANAGEMENT_TOKEN_ENV = "SLOTSERVE_MANAGEMENT_TOKEN"
INFERENCE_TOKEN_ENV = "SLOTSERVE_INFERENCE_TOKEN"

PEM = str | os.PathLike[str] | bytes  # a file path, or the PEM data itself


def token_from(value: str | None, env: str) -> str:
    """The token to send: `value`, or the environment variable `env` when `value` is None ("" sends none)."""
    return os.environ.get(env, "") if value is None else value


@dataclass(frozen=True)
class Tokens:
    """The bearer tokens of one client; repr never shows them."""

    inference: str = ""
    management: str = ""

    def __repr__(self) -> str:
        return f"Tokens(inference={'***' if self.inference else None}, management={'***' if self.management else None})"

    def metadata(self, *, management: bool = False) -> tuple[tuple[str, str], ...]:
        """The authorization header for a call (none when the client has no token)."""
        first, second = (self.management, self.inference) if management else (self.inference, self.management)
        token = first or second
        return (("authorization", f"Bearer {token}"),) if token else ()


@dataclass(frozen=True)
class TLSSettings:
    """What a TLS channel needs, read from files once."""

    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    server_name: str | None = None

    def __repr__(self) -> str:  # the key is secret; the rest is long
        return (
            f"TLSSettings(ca={self.root_certificates is not None}, "
            f"client_cert={self.certificate_chain is not None}, server_name={self.server_name!r})"
        )

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        return (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()


def tls_settings(
    tls: bool = False,
    tls_ca: PEM | None = None,
    tls_cert: PEM | None = None,
    tls_key: PEM | None = None,
    tls_server_name: str | None = None,
) -> TLSSettings | None:
    """TLSSettings when `tls` is set or any TLS argument is given, else None (plaintext).

    Raises ValueError when only one of tls_cert/tls_key is given, OSError when a file cannot be read.
    """
    if not (tls or tls_ca is not None or tls_cert is not None or tls_key is not None or tls_server_name):
        return None
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together (a client certificate needs its key)")
    return TLSSettings(
        root_certificates=_pem(tls_ca),
        private_key=_pem(tls_key),
        certificate_chain=_pem(tls_cert),
        server_name=tls_server_name or None,
    )


def _pem(value: PEM | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()
