"""Server-side TLS: read and check the certificate files once at startup, then build gRPC's credentials.

gRPC itself reports a bad certificate or key only as "Failed to bind to address" (and a mismatched pair only
in its C log), so every file is checked here first with Python's `ssl` module, and each problem is reported
naming the flag and the file: unreadable, not PEM, key not matching the certificate, encrypted key.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from ..process.options import ServerOptions


class TLSConfigError(RuntimeError):
    """A TLS file cannot be used. A RuntimeError, like every other reason `Server.start` cannot serve."""


def server_credentials(options: ServerOptions) -> grpc.ServerCredentials | None:
    """gRPC server credentials for the options' TLS files, or None to serve plaintext. Raises TLSConfigError.

    With `tls_client_ca` the server requires every client to present a certificate signed by that CA
    (mutual TLS); without it clients are not asked for one.
    """
    if options.tls_cert is None or options.tls_key is None:
        return None
    certificate = _read(options.tls_cert, "--tls-cert")
    key = _read(options.tls_key, "--tls-key")
    _check_certificates(options.tls_cert, "--tls-cert")
    _check_pair(options.tls_cert, options.tls_key)
    client_ca = None
    if options.tls_client_ca is not None:
        client_ca = _read(options.tls_client_ca, "--tls-client-ca")
        _check_certificates(options.tls_client_ca, "--tls-client-ca")
    return grpc.ssl_server_credentials(
        [(key, certificate)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def describe(options: ServerOptions) -> str:
    """How the port is secured, for the startup banner."""
    if options.tls_cert is None:
        return "plaintext (no --tls-cert)"
    if options.tls_client_ca is None:
        return "TLS"
    return "mutual TLS (client certificates required)"


def _read(path: Path, flag: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TLSConfigError(f"{flag} {path}: cannot read it: {error.strerror or error}") from None
    if not data.strip():
        raise TLSConfigError(f"{flag} {path}: the file is empty")
    return data


def _check_certificates(path: Path, flag: str) -> None:
    """The file holds at least one PEM certificate (loading it as trust anchors parses every certificate)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(path))
    except (ssl.SSLError, ValueError) as error:
        raise TLSConfigError(f"{flag} {path}: not a PEM certificate file ({_reason(error)})") from None


def _check_pair(cert: Path, key: Path) -> None:
    """The key parses, is not encrypted, and belongs to the certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # An encrypted key would make OpenSSL prompt for a passphrase on the terminal; the callback refuses.
        context.load_cert_chain(str(cert), str(key), password=_no_passphrase)
    except _EncryptedKey:
        raise TLSConfigError(f"--tls-key {key}: the key is encrypted; give an unencrypted PEM key") from None
    except ssl.SSLError as error:
        if getattr(error, "reason", None) == "KEY_VALUES_MISMATCH":
            raise TLSConfigError(f"--tls-key {key} does not match the certificate in --tls-cert {cert}") from None
        raise TLSConfigError(
            f"--tls-key {key}: not a usable PEM private key for --tls-cert {cert} ({_reason(error)})"
        ) from None


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKey()


def _reason(error: Exception) -> str:
    """OpenSSL's short reason (e.g. NO_CERTIFICATE_OR_CRL_FOUND); its long text only names its own source."""
    return getattr(error, "reason", None) or "cannot parse it"
