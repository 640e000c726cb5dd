"""tritonclient[grpc] against a server of tests/ensemble_models.py's repository (slotserve, or real Triton), in its
own process.

    python ensemble_cases.py HOST:PORT CASE

Prints one JSON object as the last line of stdout: the ensemble's outputs for a few inputs, and what the server
says of the ensemble and its steps (index, metadata, config, statistics), for tests/interop/test_ensembles.py and
tests/differential/test_ensembles.py to check and compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODELS = ("pipeline", "add3", "square", "combine")


def infer(client, x: np.ndarray, outputs=None) -> dict:
    tensor = grpcclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    result = client.infer("pipeline", [tensor], outputs=requested)
    names = [o["name"] for o in result.get_response(as_json=True)["outputs"]]
    return {name: result.as_numpy(name).tolist() for name in names}


def case_pipeline(client) -> dict:
    inputs = [np.arange(-3, 5, dtype=np.float32), np.array([0.5], dtype=np.float32)]
    answers = [infer(client, x) for x in inputs]
    try:  # the wrong datatype: refused before any step runs
        tensor = grpcclient.InferInput("X", [2], "INT32")
        tensor.set_data_from_numpy(np.zeros(2, dtype=np.int32))
        client.infer("pipeline", [tensor])
        wrong_type = "answered"
    except InferenceServerException as error:
        wrong_type = str(error.status()).replace("StatusCode.", "")
    metadata = client.get_model_metadata("pipeline", as_json=True)
    config = client.get_model_config("pipeline", as_json=True)["config"]
    index = client.get_model_repository_index(as_json=True).get("models", [])
    stats = client.get_inference_statistics(as_json=True).get("model_stats", [])
    return {
        "inputs": [x.tolist() for x in inputs],
        "answers": answers,
        "wrong_type": wrong_type,
        "metadata": {
            "platform": metadata.get("platform"),
            "inputs": [[t["name"], t["datatype"], t["shape"]] for t in metadata["inputs"]],
            "outputs": [[t["name"], t["datatype"], t["shape"]] for t in metadata["outputs"]],
        },
        "config_platform": config.get("platform"),
        "config_steps": [s["model_name"] for s in config["ensemble_scheduling"]["step"]],
        "index": sorted([m["name"], m.get("state", ""), m.get("version", "")] for m in index),
        "statistics": {
            s["name"]: {
                "inference_count": int(s.get("inference_count", 0)),
                "execution_count": int(s.get("execution_count", 0)),
                "success": int(s["inference_stats"].get("success", {}).get("count", 0)),
                "fail": int(s["inference_stats"].get("fail", {}).get("count", 0)),
            }
            for s in stats
            if s["name"] in MODELS
        },
    }


def case_subset(client) -> dict:
    """One output of two asked for: its names, or [status, message] of a refusal."""
    try:
        return {"only_y": sorted(infer(client, np.arange(4, dtype=np.float32), outputs=["Y"]))}
    except InferenceServerException as error:
        return {"only_y": [str(error.status()).replace("StatusCode.", ""), error.message()]}


def case_step_unloaded(client) -> dict:
    """Unload the step 'square', then: the index, the ensemble's readiness and a call; load it again, the same."""

    def seen() -> dict:
        index = client.get_model_repository_index(as_json=True).get("models", [])
        try:
            answered = sorted(infer(client, np.arange(3, dtype=np.float32)))
        except InferenceServerException as error:
            answered = [str(error.status()).replace("StatusCode.", ""), error.message()]
        return {
            "index": sorted([m["name"], m.get("state", ""), m.get("reason", "")] for m in index),
            "ready": client.is_model_ready("pipeline"),
            "call": answered,
        }

    client.unload_model("square")
    unloaded = seen()
    client.load_model("square")
    return {"unloaded": unloaded, "reloaded": seen()}


def case_step_failed(client) -> dict:
    """The step 'square' failed to load at startup: what the server says of the ensemble; then 'square' loaded
    with a working model.py (a load with files): the same."""
    import textwrap

    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout, for tests/ensemble_models.py
    from tests.ensemble_models import SQUARE, SQUARE_CONFIG_JSON

    failed = _seen(client)
    client.load_model("square", config=SQUARE_CONFIG_JSON, files={"file:1/model.py": textwrap.dedent(SQUARE).encode()})
    return {"failed": failed, "reloaded": _seen(client)}


def case_explicit_load(client) -> dict:
    """Explicit mode with nothing loaded: load the ensemble alone, then unload it; the index after each."""

    def index() -> list:
        models = client.get_model_repository_index(as_json=True).get("models", [])
        return sorted([m["name"], m.get("state", "")] for m in models)

    before = index()
    client.load_model("pipeline")
    loaded = {"index": index(), "call": sorted(infer(client, np.arange(3, dtype=np.float32)))}
    client.unload_model("pipeline")
    return {"before": before, "loaded": loaded, "unloaded": index()}


def _seen(client) -> dict:
    index = client.get_model_repository_index(as_json=True).get("models", [])
    try:
        answered = sorted(infer(client, np.arange(3, dtype=np.float32)))
    except InferenceServerException as error:
        answered = [str(error.status()).replace("StatusCode.", ""), error.message()]
    return {
        "index": sorted([m["name"], m.get("state", ""), m.get("reason", "")] for m in index),
        "ready": client.is_model_ready("pipeline"),
        "call": answered,
    }


def main() -> int:
    address, case = sys.argv[1], sys.argv[2]
    with grpcclient.InferenceServerClient(address) as client:
        print(json.dumps(globals()[f"case_{case}"](client)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
