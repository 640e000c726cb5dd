"""Asked of real Triton 2.51 and of slotserve on the same repository: priority levels and queue policies
(docs/lifecycle.md, Priorities).

One python model (written below) per configuration, `max_batch_size: 1` so every execute runs one request, one
instance. Its execute appends the request's KEY to a log file in the test's gate folder and holds while the file
`hold-<KEY>` exists (a file gate the test removes). A test holds a first request in execute, queues the others one
at a time (each seen pending in `nv_inference_pending_request_count` before the next is sent), lets the first go,
and reads the order from the log:

- levels served from level 1, FIFO within a level; priority 0 and priorities above the levels take the default;
- a level's own max_queue_size refuses past it while another level still queues (the status codes compared);
- a REJECT level's timeout fails a request still queued past it; DELAY moves it behind its level's others, ahead
  of the lower levels; a request's `timeout` shortens a level's only where the level allows it;
- a model without priority levels serves every priority in arrival order.

Skips, naming the reason, where the reference is not set up (bench/setup.sh builds it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import pytest

from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from tests.integration._python_overlap import pending_requests, wait_until

from .conftest import INSTALLATION, MISSING_REASON
from .reference import run_triton

pytestmark = pytest.mark.interop

MODEL_PY = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = json.loads(args["model_config"])["parameters"]["gates"]["string_value"]

    def execute(self, requests):
        keys = [int(pb_utils.get_input_tensor_by_name(r, "KEY").as_numpy().reshape(-1)[0]) for r in requests]
        with open(os.path.join(self.folder, "log"), "a") as log:
            log.write(" ".join(str(key) for key in keys) + "\\n")
        deadline = time.monotonic() + 120
        while os.path.exists(os.path.join(self.folder, f"hold-{keys[0]}")) and time.monotonic() < deadline:
            time.sleep(0.005)  # ordering-free: polls the test's file gate until a deadline
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[key]], np.int32))]) for key in keys
        ]
"""

MODELS: dict[str, str | None] = {
    "prio_order": "priority_levels: 3 default_priority_level: 2",
    "prio_limit": (
        "priority_levels: 2 default_priority_level: 2 priority_queue_policy { key: 1 value { max_queue_size: 1 } }"
    ),
    "prio_reject": (
        "priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { default_timeout_microseconds: 60000000 allow_timeout_override: false } "
        "priority_queue_policy { key: 1 value { default_timeout_microseconds: 60000000 allow_timeout_override: true } }"
    ),
    "prio_delay": (
        "priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 60000000 "
        "allow_timeout_override: true }"
    ),
    "prio_none": "",
    "prio_direct": None,  # no dynamic_batching at all
}
SHORT_US = 200_000  # a request's own `timeout` that passes while the test holds the first request


def write_repository(folder: Path, gates: Path) -> Path:
    """The MODELS, each a copy of MODEL_PY with its batching settings, holding at the files of `gates`."""
    root = folder / "repository"
    for name, batching in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 1\n'
            'input [ { name: "KEY" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
            + ("" if batching is None else f"dynamic_batching {{ {batching} }}\n")
            + f'parameters {{ key: "gates" value {{ string_value: "{gates}" }} }}\n'
        )
    return root


@dataclass(frozen=True)
class Server:
    name: str
    address: str
    metrics_url: str
    gates: Path


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    """(Triton, slotserve), each on its own copy of the repository (its own gate folder), started once."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    from service.testing import serve

    folder = tmp_path_factory.mktemp("priorities")
    gates = {name: folder / f"gates-{name}" for name in ("triton", "slotserve")}
    for path in gates.values():
        path.mkdir()
    triton_repository = write_repository(folder / "triton", gates["triton"])
    ours_repository = write_repository(folder / "slotserve", gates["slotserve"])
    with run_triton(INSTALLATION, triton_repository, folder / "triton-run") as triton:
        with serve(ours_repository, parallel_jobs=1, metrics_port=0) as ours:
            yield (
                Server("triton", triton.address, triton.metrics_url, gates["triton"]),
                Server(
                    "slotserve",
                    ours.address,
                    f"http://127.0.0.1:{ours.server.metrics_port}/metrics",
                    gates["slotserve"],
                ),
            )


class Call:
    """One ModelInfer on a thread of its own: its answer's KEY, or its status code and message."""

    def __init__(self, server: Server, model: str, key: int, **parameters: int) -> None:
        message = pb.ModelInferRequest(model_name=model)
        tensor = message.inputs.add(name="KEY", datatype="INT32", shape=[1, 1])
        tensor.contents.int_contents.append(key)
        for name, value in parameters.items():
            message.parameters[name].int64_param = value
        self.outcome: tuple[str, str] | None = None
        self._thread = threading.Thread(target=self._run, args=(server.address, message), daemon=True)
        self._thread.start()

    def _run(self, address: str, message: pb.ModelInferRequest) -> None:
        with grpc.insecure_channel(address) as channel:
            try:
                reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=120)
                self.outcome = ("OK", str(int.from_bytes(reply.raw_output_contents[0][:4], "little", signed=True)))
            except grpc.RpcError as error:
                self.outcome = (error.code().name, error.details() or "")

    def result(self) -> tuple[str, str]:
        self._thread.join(150)
        assert self.outcome is not None, "the call never ended"
        return self.outcome


def executed(server: Server) -> list[int]:
    log = server.gates / "log"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def scenario(
    server: Server,
    model: str,
    queued: list[tuple[int, dict]],
    pause_us: int = 0,
    while_held: Callable[[Server, list[Call]], None] | None = None,
) -> tuple[list, list]:
    """Hold key 1 in execute, queue `queued` ((key, parameters)) one at a time behind it, wait `pause_us` (for
    timeouts to pass), call `while_held`, let key 1 go. Returns (each queued call's outcome, the keys executed in
    order after key 1)."""
    (server.gates / "log").unlink(missing_ok=True)
    hold = server.gates / "hold-1"
    hold.touch()
    first = Call(server, model, 1)
    calls = []
    try:
        wait_until(lambda: executed(server) == [1], f"{server.name}: key 1 in execute")
        for key, parameters in queued:
            before = pending_requests(server.metrics_url, model)
            call = Call(server, model, key, **parameters)
            calls.append(call)
            wait_until(partial(_queued_or_answered, server, model, before, call), f"{server.name}: key {key} queued")
        if pause_us:
            passed = time.monotonic() + pause_us / 1e6
            wait_until(lambda: time.monotonic() > passed, "the short timeouts passed")
        if while_held is not None:
            while_held(server, calls)
    finally:
        hold.unlink(missing_ok=True)
    assert first.result() == ("OK", "1")
    outcomes = [call.result() for call in calls]
    return outcomes, executed(server)[1:]


def _queued_or_answered(server: Server, model: str, before: int, call: Call) -> bool:
    return pending_requests(server.metrics_url, model) > before or call.outcome is not None


def ask_both(servers, *args, **kwargs):
    triton, ours = (scenario(server, *args, **kwargs) for server in servers)
    return triton, ours


def test_levels_are_served_from_level_1_fifo_within_each_and_0_or_too_high_take_the_default_on_both(servers):
    queued = [(10, {"priority": 3}), (11, {"priority": 1}), (12, {"priority": 2}), (13, {"priority": 1})]
    queued += [(14, {"priority": 0}), (15, {"priority": 99}), (16, {})]
    triton, ours = ask_both(servers, "prio_order", queued)
    assert ours == triton
    assert triton[1] == [11, 13, 12, 14, 15, 16, 10]
    assert all(outcome[0] == "OK" for outcome in triton[0])


def test_a_full_level_refuses_while_another_level_still_queues_on_both(servers):
    queued = [(20, {"priority": 1}), (21, {"priority": 1}), (22, {"priority": 2}), (23, {"priority": 2})]
    triton, ours = ask_both(servers, "prio_limit", queued)
    assert [code for code, _ in ours[0]] == [code for code, _ in triton[0]] == ["OK", "UNAVAILABLE", "OK", "OK"]
    assert ours[1] == triton[1] == [20, 22, 23]


def test_a_reject_level_fails_a_request_past_its_timeout_and_the_override_only_where_allowed_on_both(servers):
    # Level 1 allows a request's own timeout, level 2 does not: only key 30's short timeout counts.
    queued = [
        (30, {"priority": 1, "timeout": SHORT_US}),
        (31, {"priority": 1}),
        (32, {"priority": 2, "timeout": SHORT_US}),
    ]
    triton, ours = ask_both(servers, "prio_reject", queued, pause_us=2 * SHORT_US, while_held=_refused_when)
    assert [code for code, _ in ours[0]] == [code for code, _ in triton[0]] == ["UNAVAILABLE", "OK", "OK"]
    assert ours[1] == triton[1] == [31, 32]


def _refused_when(server: Server, calls: list[Call]) -> None:
    """A deliberate difference (docs/migrating-from-triton.md): slotserve refuses the request as its timeout passes,
    while the slot is still held; Triton only once its scheduler looks at the queue again (the slot freed)."""
    if server.name == "slotserve":
        wait_until(lambda: calls[0].outcome is not None, "slotserve refuses key 30 while key 1 still runs")
    else:
        assert calls[0].outcome is None, "Triton answered key 30 while key 1 still held its instance"


def test_delay_moves_a_timed_out_request_behind_its_level_ahead_of_lower_levels_on_both(servers):
    queued = [(40, {"priority": 1, "timeout": SHORT_US}), (41, {"priority": 1}), (42, {"priority": 2})]
    triton, ours = ask_both(servers, "prio_delay", queued, pause_us=2 * SHORT_US)
    assert ours == triton
    assert triton == ([("OK", "40"), ("OK", "41"), ("OK", "42")], [41, 40, 42])


@pytest.mark.parametrize("model", ["prio_none", "prio_direct"])
def test_a_model_without_levels_serves_every_priority_in_arrival_order_on_both(servers, model):
    queued = [(50, {"priority": 3}), (51, {"priority": 1}), (52, {"priority": 2})]
    triton, ours = ask_both(servers, model, queued)
    assert ours == triton
    assert triton[1] == [50, 51, 52]


BAD_CONFIGS = {
    "bad_default": ("priority_levels: 3", "default priority level must be in range [1, 3] for bad_default"),
    "bad_default_high": (
        "priority_levels: 3 default_priority_level: 5",
        "default priority level must be in range [1, 3] for bad_default_high",
    ),
    "bad_policy_level": (
        "priority_levels: 3 default_priority_level: 2 priority_queue_policy { key: 4 value { } }",
        "priority queue policy must have priority level in range [1, 3] for bad_policy_level",
    ),
}


def test_levels_outside_1_to_priority_levels_are_refused_at_load_in_tritons_words_on_both(
    tmp_path, triton, slotserve_endpoint
):
    """NVIDIA's qa/L0_model_config noautofill cases default_priority_level0/1 and priority_level1, on a python model.
    Triton answers RepositoryModelLoad INTERNAL "failed to poll from model repository" and logs its words; slotserve
    answers INVALID_ARGUMENT with the same words (a configuration error, as for every invalid config.pbtxt)."""
    root = tmp_path / "repository"
    for name, (batching, _) in BAD_CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
            'input [ { name: "KEY" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            f"dynamic_batching {{ {batching} }}\n"
        )
    reference = triton(root, "--model-control-mode=explicit")
    ours = slotserve_endpoint(root, model_control_mode="explicit")
    for name, (_, words) in BAD_CONFIGS.items():
        request = pb.RepositoryModelLoadRequest(model_name=name)
        with pytest.raises(grpc.RpcError) as theirs:
            reference.stub.RepositoryModelLoad(request, timeout=120)
        assert theirs.value.code().name == "INTERNAL"
        assert theirs.value.details() == f"failed to load '{name}', failed to poll from model repository"
        with pytest.raises(grpc.RpcError) as refused:
            ours.stub.RepositoryModelLoad(request, timeout=120)
        assert refused.value.code().name == "INVALID_ARGUMENT" and words in (refused.value.details() or "")
    (log,) = (tmp_path / "triton-run").glob("tritonserver-*.log")
    text = log.read_text(errors="replace")
    assert all(words in text for _, words in BAD_CONFIGS.values()), text[-3000:]


@pytest.mark.parametrize(
    "kind, value, words",
    [
        ("int64_param", -1, "invalid value for 'priority', expected value >= 0."),
        ("string_param", "high", "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
        ("bool_param", True, "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
    ],
)
def test_a_bad_priority_is_invalid_argument_in_the_same_words_on_both(servers, kind, value, words):
    message = pb.ModelInferRequest(model_name="prio_order")
    message.inputs.add(name="KEY", datatype="INT32", shape=[1, 1]).contents.int_contents.append(7)
    setattr(message.parameters["priority"], kind, value)
    for server in servers:
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message, timeout=60)
        assert refused.value.code().name == "INVALID_ARGUMENT", server.name
        assert words in (refused.value.details() or ""), (server.name, refused.value.details())


ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 1
input [ { name: "KEY" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "prio_order" model_version: -1
  input_map { key: "KEY" value: "KEY" } output_map { key: "OUT" value: "OUT" } } ] }
"""


def test_an_ensemble_passes_its_requests_priority_to_its_steps(tmp_path):
    """Asked of Triton: an ensemble request's priority reaches its step's queue."""
    if INSTALLATION is None:
        pytest.skip(MISSING_REASON)
    from service.testing import serve

    orders = {}
    for name in ("triton", "slotserve"):
        gates = tmp_path / f"gates-{name}"
        gates.mkdir()
        root = write_repository(tmp_path / name, gates)
        (root / "ens" / "1").mkdir(parents=True)
        (root / "ens" / "config.pbtxt").write_text(ENSEMBLE)
        if name == "triton":
            with run_triton(INSTALLATION, root, tmp_path / "triton-run") as triton:
                server = Server(name, triton.address, triton.metrics_url, gates)
                orders[name] = _ensemble_order(server)
        else:
            with serve(root, parallel_jobs=1, metrics_port=0) as ours:
                url = f"http://127.0.0.1:{ours.server.metrics_port}/metrics"
                orders[name] = _ensemble_order(Server(name, ours.address, url, gates))
    assert orders["triton"] == [11, 10], orders  # the ensemble's level-1 request went before the older default one
    assert orders["slotserve"] == orders["triton"], orders


def _ensemble_order(server: Server) -> list[int]:
    """Key 1 held on prio_order; key 10 sent to it at the default level, then key 11 through the ensemble at level
    1; the order they ran in."""
    hold = server.gates / "hold-1"
    hold.touch()
    first = Call(server, "prio_order", 1)
    try:
        wait_until(lambda: executed(server) == [1], f"{server.name}: key 1 in execute")
        default = Call(server, "prio_order", 10)
        wait_until(lambda: pending_requests(server.metrics_url, "prio_order") >= 1, f"{server.name}: key 10 queued")
        ensemble = Call(server, "ens", 11, priority=1)
        wait_until(lambda: pending_requests(server.metrics_url, "prio_order") >= 2, f"{server.name}: key 11 queued")
    finally:
        hold.unlink(missing_ok=True)
    assert first.result() == ("OK", "1") and default.result() == ("OK", "10") and ensemble.result() == ("OK", "11")
    return executed(server)[1:]
