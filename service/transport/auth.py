"""Bearer-token authentication: which RPCs need which token, and the constant-time check.

Three access levels, declared per RPC in the servicers (`rpc(access=...)` in servicers/common.py):

* OPEN: health and liveness probes (ServerLive, ServerReady, ModelReady; grpc.health.v1 is grpc's own servicer
  and never checks). Kubernetes and load balancers probe without credentials, so these never need a token.
* READ: inference, metadata, config and statistics. Needs a token only when `--inference-token` is set; then
  the inference token or the management token (which may do everything).
* STATUS: the management service's status calls (ListModels, GetModel) and the repository index: what the
  operator's tools read. When `--management-token` is set they need it, as every RPC of the management and
  repository-control protocols does (Triton restricts its model-repository protocol, index included, the same
  way); without one, they are READ. They change nothing, so they never need `--allow-management`.
* MANAGE: management mutations and repository load/unload. Needs `--allow-management`, and when
  `--management-token` is set, that token. Without a management token but with an inference token, the
  inference token: a level never needs less than the level below it.

Tokens arrive as gRPC metadata `authorization: Bearer <token>`. They are compared as SHA-256 digests with
`hmac.compare_digest`, so neither the content nor the length of the expected token shows in the timing. No
token, presented or expected, is ever written to a log or an error message; `Secret` masks itself in repr/str.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import Unauthenticated

if TYPE_CHECKING:  # options.py imports this module; keep it light for the command line
    import grpc

_LOG = logging.getLogger(__name__)

AUTHORIZATION = "authorization"
SCHEME = "bearer"  # RFC 6750; the scheme name is case-insensitive (RFC 9110 §11.1)


class Access(enum.Enum):
    OPEN = "open"
    READ = "read"
    STATUS = "status"
    MANAGE = "manage"


class Secret:
    """A token that never prints itself. Construction validates what a gRPC metadata value can carry.

    Raises ValueError (naming `what`, never the value) for an empty token or one with characters other than
    visible ASCII: gRPC metadata values are ASCII, and a space would be cut at the scheme's separator.
    """

    __slots__ = ("_digest",)

    def __init__(self, value: str, what: str = "token") -> None:
        if not value:
            raise ValueError(f"{what} is empty")
        if not all("\x21" <= char <= "\x7e" for char in value):
            raise ValueError(f"{what} may hold only visible ASCII characters (no spaces or control characters)")
        # Only the digest is kept: it is what the check compares, and a core dump shows no token.
        self._digest = _digest(value)

    def matches(self, presented: str) -> bool:
        """Constant-time comparison with a presented token."""
        return hmac.compare_digest(self._digest, _digest(presented))

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._digest, other._digest)

    def __hash__(self) -> int:
        return hash(self._digest)


def _digest(value: str) -> bytes:
    # Hashing first gives equal-length inputs to compare_digest, so the expected token's length does not leak.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def secret_of(value: str | Secret | None, what: str) -> Secret | None:
    """A Secret from a string (validated), a Secret (as is) or None."""
    if value is None or isinstance(value, Secret):
        return value
    return Secret(value, what)


def read_token_file(path: str | Path, flag: str) -> Secret:
    """The token in a file (a secret mounted by Kubernetes, for example): its text without the trailing newline.

    Raises ValueError naming the flag and the file (never its content) when the file cannot be read, is
    empty, or holds characters a token cannot have.
    """
    try:
        text = Path(path).read_text(encoding="ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {path}: the token may hold only visible ASCII characters") from None
    except OSError as error:
        raise ValueError(f"{flag} {path}: cannot read it: {error.strerror or error}") from None
    # Editors and `echo` end files with a newline; it is not part of the token.
    return Secret(text.rstrip("\r\n"), f"{flag} {path}: the token")


def bearer_tokens(metadata: Iterable[tuple[str, str | bytes]] | None) -> list[str]:
    """Every token sent as `authorization: Bearer <token>` (a malformed value yields none)."""
    tokens = []
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION or not isinstance(value, str):
            continue
        scheme, _, credentials = value.strip().partition(" ")
        if scheme.lower() == SCHEME and credentials.strip():
            tokens.append(credentials.strip())
    return tokens


class Authenticator:
    """Checks a call's bearer token against the tokens the server was started with."""

    def __init__(self, management_token: Secret | None = None, inference_token: Secret | None = None) -> None:
        self.management_token = management_token
        self.inference_token = inference_token

    def _expected(self, access: Access) -> tuple[str, list[Secret]]:
        """(which token the message names, the tokens that grant `access`); no tokens: nothing is required."""
        if access is Access.MANAGE or access is Access.STATUS:
            if self.management_token is not None:
                return "management", [self.management_token]
            # Never weaker than READ: with only an inference token set, managing needs that token too.
            return "inference", [self.inference_token] if self.inference_token is not None else []
        if access is Access.READ and self.inference_token is not None:
            # The management token may do everything, so one token suffices for an operator's tools.
            granted = [self.inference_token]
            if self.management_token is not None:
                granted.append(self.management_token)
            return "inference", granted
        return "", []

    def check(self, access: Access, operation: str, context: grpc.ServicerContext) -> None:
        """Return if the call may run `operation`; else raise Unauthenticated (the message names the operation
        and what is missing, never a token)."""
        kind, granted = self._expected(access)
        if not granted:
            return
        presented = bearer_tokens(context.invocation_metadata())
        # Every presented token is compared with every granted one (no early exit), so the timing does not
        # tell which comparison failed.
        matched = False
        for token in presented:
            for secret in granted:
                matched |= secret.matches(token)
        if matched:
            return
        problem = "a wrong bearer token" if presented else "no bearer token"
        _LOG.info("refused %s from %s: %s", operation, context.peer(), problem)
        raise Unauthenticated(
            f"{operation} needs the {kind} token (metadata 'authorization: Bearer <token>'); the call had {problem}"
        )


def management_unprotected(
    management_allowed: bool, management_token: Secret | None, inference_token: Secret | None
) -> bool:
    """Management is enabled and no token guards it: anyone who reaches the port may change the models."""
    return management_allowed and management_token is None and inference_token is None


def describe(
    management_allowed: bool, management_token: Secret | None, inference_token: Secret | None, tls: str
) -> list[str]:
    """Startup banner lines saying who may call what (never a token)."""
    if not management_allowed:
        management = "management: disabled (start with --allow-management to enable it)"
    elif management_token is None and inference_token is not None:
        management = "management: enabled for holders of the inference token (no --management-token)"
    elif management_token is None:
        management = (
            "management: ENABLED WITHOUT A TOKEN: anyone who reaches the port may register, load and "
            "unload models (set --management-token-file)"
        )
    else:
        management = "management: enabled, bearer token required"
    inference = (
        "inference: bearer token required (health probes and ModelReady stay open)"
        if inference_token is not None
        else "inference: open (no --inference-token)"
    )
    return [management, inference, f"transport: {tls}"]
