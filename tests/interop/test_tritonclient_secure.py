"""tritonclient[grpc] against a slotserve with mutual TLS and both tokens (clients/tritonclient_cases.py
`secure`): a stock client reaches it with its own TLS options and per-call `authorization` headers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration._certs import make_pki

pytestmark = pytest.mark.interop

INFERENCE_TOKEN = "interop-inference-token"
MANAGEMENT_TOKEN = "interop-management-token"


def test_mutual_tls_and_tokens(slotserve, demo_repository, run_client, tmp_path):
    pki = make_pki(tmp_path / "pki")
    server = slotserve(
        demo_repository,
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca.cert,
        tls_ca=pki.ca.cert,
        tls_client_cert=pki.client.cert,
        tls_client_key=pki.client.key,
        allow_management=True,
        management_token=MANAGEMENT_TOKEN,
        inference_token=INFERENCE_TOKEN,
    )
    result = run_client(
        "tritonclient_cases.py",
        server.address,
        "secure",
        str(pki.ca.cert),
        str(pki.client.cert),
        str(pki.client.key),
        INFERENCE_TOKEN,
        MANAGEMENT_TOKEN,
    )
    assert result["refused"] == {
        "none": "StatusCode.UNAUTHENTICATED",
        "wrong": "StatusCode.UNAUTHENTICATED",
        "unload_with_inference_token": "StatusCode.UNAUTHENTICATED",
    }
    entry = result["result"]
    a, b = np.asarray(entry["INPUT0"], np.int32), np.asarray(entry["INPUT1"], np.int32)
    np.testing.assert_array_equal(np.asarray(entry["OUTPUT0"], np.int32), a + b)
    np.testing.assert_array_equal(np.asarray(entry["OUTPUT1"], np.int32), a - b)
    assert server.client.model_ready("simple")  # the server's own client (mutual TLS) still serves
