"""The Silero VAD checkpoint (a real published model, taken from the silero-vad wheel) through slotserve equals an
in-process ONNX Runtime session built with the same session options, bit for bit, over several chunks of audio
with the recurrent state carried forward. Its scalar `sr` input (shape []) exercises zero-dimension tensors on the
wire. slotserve's own client is used, so this one runs in the test's process."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

from engine.config.repository import ModelRepository
from engine.onnxruntime_backend import session_options

pytestmark = pytest.mark.interop

MODEL = "silero_vad"


@pytest.fixture
def reference(demo_repository):
    spec = ModelRepository(demo_repository).read(MODEL)
    return onnxruntime.InferenceSession(str(spec.model_file), session_options(spec), providers=["CPUExecutionProvider"])


def test_metadata_declares_a_scalar_sr(slotserve, demo_repository):
    server = slotserve(demo_repository)
    inputs = {t.name: t for t in server.client.model_metadata(MODEL).inputs}
    assert inputs["sr"].datatype == "INT64" and inputs["sr"].shape == ()


@pytest.mark.parametrize(
    ("rate", "chunk", "batch", "chunks"),
    [
        (16000, 512, 1, 8),
        (8000, 256, 1, 6),
        (16000, 512, 3, 4),
    ],
)
def test_outputs_equal_onnxruntime_bit_for_bit(slotserve, demo_repository, reference, rate, chunk, batch, chunks):
    server = slotserve(demo_repository)
    rng = np.random.default_rng(1234 + rate + batch)
    # Noise with a tone that comes and goes, so the speech probability and the state move between chunks.
    time = np.arange(chunks * chunk) / rate
    tone = 0.5 * np.sin(2 * np.pi * 220 * time) * (np.sin(2 * np.pi * 1.5 * time) > 0)
    audio = (rng.normal(0, 0.05, size=(batch, chunks * chunk)) + tone).astype(np.float32)
    sr = np.array(rate, dtype=np.int64)
    assert sr.shape == ()

    served_state = np.zeros((2, batch, 128), dtype=np.float32)
    reference_state = served_state.copy()
    probabilities = []
    for index in range(chunks):
        samples = np.ascontiguousarray(audio[:, index * chunk : (index + 1) * chunk])
        served = server.client.infer(MODEL, {"input": samples, "state": served_state, "sr": sr})
        expected_output, expected_state = reference.run(
            ["output", "stateN"], {"input": samples, "state": reference_state, "sr": sr}
        )

        assert served["output"].dtype == expected_output.dtype == np.float32
        assert served["output"].shape == expected_output.shape == (batch, 1)
        assert served["stateN"].shape == expected_state.shape == (2, batch, 128)
        assert np.array_equal(served["output"], expected_output), (index, served["output"], expected_output)
        assert np.array_equal(served["stateN"], expected_state), index
        # Bit for bit, not merely equal as numbers (this also tells +0.0 from -0.0).
        assert served["output"].tobytes() == expected_output.tobytes()
        assert served["stateN"].tobytes() == expected_state.tobytes()
        assert not np.array_equal(served["stateN"], served_state), "the state did not move"

        served_state, reference_state = np.array(served["stateN"]), expected_state
        probabilities.append(expected_output.copy())
    # The comparison was not vacuous: the model's answer changed across chunks.
    assert len({p.tobytes() for p in probabilities}) > 1
