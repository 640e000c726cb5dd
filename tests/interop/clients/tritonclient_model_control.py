"""tritonclient[grpc]'s model control against a running slotserve, in its own process (never imported into the
process holding slotserve's generated code: see tritonclient_cases.py).

    python tritonclient_model_control.py HOST:PORT CASE CONFIG_JSON MODEL_FILE

Cases:
- files: `load_model(name, config=..., files={"file:1/model.onnx": ...})` as tritonclient's model-control example
  does it, then infer, reload, unload, and the refusals (no config, a bad name).
- explicit: unload, infer (refused), load, infer.

Prints one JSON object (what it saw) as its last line of stdout.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

VALUES = np.arange(6, dtype=np.float32).reshape(1, 6)


def identity(client, name: str) -> list:
    request = grpcclient.InferInput("INPUT0", list(VALUES.shape), "FP32")
    request.set_data_from_numpy(VALUES)
    return client.infer(name, [request]).as_numpy("OUTPUT0").tolist()


def failure(call) -> dict | None:
    try:
        call()
    except InferenceServerException as error:
        return {"status": error.status(), "message": error.message()}
    return None


def case_files(client, config: str, model: bytes) -> dict:
    seen = {}
    client.load_model("fresh", config=config, files={"file:1/model.onnx": model})
    seen["ready_after_load"] = client.is_model_ready("fresh")
    seen["infer_after_load"] = identity(client, "fresh")
    client.load_model("fresh", config=config, files={"file:1/model.onnx": model})
    seen["infer_after_reload"] = identity(client, "fresh")
    seen["no_config"] = failure(lambda: client.load_model("other", files={"file:1/model.onnx": model}))
    seen["bad_name"] = failure(lambda: client.load_model("other", config=config, files={"file:../model.onnx": model}))
    client.unload_model("fresh")
    seen["ready_after_unload"] = client.is_model_ready("fresh")
    seen["infer_after_unload"] = failure(lambda: identity(client, "fresh"))
    return seen


def case_explicit(client, _config: str, _model: bytes) -> dict:
    seen = {"ready_at_start": client.is_model_ready("identity_fp32")}
    client.unload_model("identity_fp32")
    seen["ready_after_unload"] = client.is_model_ready("identity_fp32")
    seen["infer_after_unload"] = failure(lambda: identity(client, "identity_fp32"))
    seen["still_after_unload"] = failure(lambda: identity(client, "identity_fp32"))
    client.load_model("identity_fp32")
    seen["ready_after_load"] = client.is_model_ready("identity_fp32")
    seen["infer_after_load"] = identity(client, "identity_fp32")
    return seen


def main() -> None:
    address, case, config_path, model_path = sys.argv[1:5]
    config = open(config_path).read()
    model = open(model_path, "rb").read()
    client = grpcclient.InferenceServerClient(address)
    try:
        seen = {"files": case_files, "explicit": case_explicit}[case](client, config, model)
    finally:
        client.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
