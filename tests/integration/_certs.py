"""Certificates made at test time with the `openssl` command line (no extra Python dependency).

`make_pki(directory)` writes a CA, a server certificate it signed (SAN localhost and 127.0.0.1), a client
certificate it signed, a second "rogue" CA with a client certificate of its own (a certificate the server must
refuse), and a server certificate naming only `slotserve.test` (for the target-name override). EC P-256 keys:
fast to generate, and supported by both gRPC (BoringSSL) and Python's ssl.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

OTHER_NAME = "slotserve.test"


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    ca: Pair
    server: Pair  # SAN DNS:localhost, IP:127.0.0.1
    client: Pair  # signed by ca, clientAuth
    rogue_ca: Pair
    rogue_client: Pair  # signed by rogue_ca
    other_name_server: Pair  # SAN DNS:slotserve.test only


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the openssl command line is needed to make test certificates")
    result = subprocess.run([openssl, *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _key(path: Path) -> Path:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    return path


def _ca(directory: Path, name: str) -> Pair:
    key = _key(directory / f"{name}.key")
    cert = directory / f"{name}.pem"
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(key),
        "-out",
        str(cert),
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    return Pair(cert, key)


def _leaf(directory: Path, name: str, ca: Pair, extensions: str) -> Pair:
    key = _key(directory / f"{name}.key")
    request = directory / f"{name}.csr"
    cert = directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-key", str(key), "-out", str(request), "-subj", f"/CN={name}")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(request),
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    return Pair(cert, key)


def _server_extensions(*names: str) -> str:
    return (
        f"subjectAltName={','.join(names)}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )


_CLIENT_EXTENSIONS = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"


def make_pki(directory: Path) -> PKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    rogue = _ca(directory, "rogue-ca")
    return PKI(
        ca=ca,
        server=_leaf(directory, "server", ca, _server_extensions("DNS:localhost", "IP:127.0.0.1")),
        client=_leaf(directory, "client", ca, _CLIENT_EXTENSIONS),
        rogue_ca=rogue,
        rogue_client=_leaf(directory, "rogue-client", rogue, _CLIENT_EXTENSIONS),
        other_name_server=_leaf(directory, "other-name", ca, _server_extensions(f"DNS:{OTHER_NAME}")),
    )
