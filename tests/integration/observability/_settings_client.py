"""tritonclient's trace and log settings calls, run in a process of its own (tritonclient registers its own copy of
the protocol's .proto files and cannot share a process with slotserve's generated code; tests/interop/conftest.py).

Usage: _settings_client.py ADDRESS MANAGEMENT_TOKEN. Prints one JSON object: each step's answer, or the status code
and message of its refusal."""

from __future__ import annotations

import json
import sys

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def main() -> None:
    address, token = sys.argv[1], sys.argv[2]
    client = grpcclient.InferenceServerClient(address)
    manage = {"authorization": f"Bearer {token}"}
    results: dict[str, object] = {}

    def step(name: str, call, *args, **kwargs) -> None:
        try:
            answer = call(*args, as_json=True, **kwargs)
            results[name] = answer["settings"]
        except InferenceServerException as error:
            results[name] = {"refused": str(error.status()), "message": error.message()}

    step("global", client.get_trace_settings)
    step("update_without_token", client.update_trace_settings, settings={"trace_rate": "5"})
    step(
        "update_global",
        client.update_trace_settings,
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "5"},
        headers=manage,
    )
    step(
        "update_model", client.update_trace_settings, model_name="simple", settings={"trace_count": "3"}, headers=manage
    )
    step("model", client.get_trace_settings, model_name="simple")
    step(
        "clear_model", client.update_trace_settings, model_name="simple", settings={"trace_count": None}, headers=manage
    )
    step("unknown_model", client.get_trace_settings, model_name="no_such_model")
    step("trace_file", client.update_trace_settings, settings={"trace_file": "/tmp/elsewhere.json"}, headers=manage)
    step("bad_rate", client.update_trace_settings, settings={"trace_rate": "fast"}, headers=manage)
    step("logs", client.get_log_settings)
    step(
        "logs_update",
        client.update_log_settings,
        settings={"log_verbose_level": 2, "log_format": "json"},
        headers=manage,
    )
    step("logs_bad", client.update_log_settings, settings={"log_format": "yaml"}, headers=manage)
    step("logs_file", client.update_log_settings, settings={"log_file": "/tmp/elsewhere.log"}, headers=manage)
    step("logs_after", client.get_log_settings)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
