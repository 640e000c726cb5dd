"""Custom metrics driven by the request (tests/integration/observability/test_custom_metrics.py): OPS is a JSON list
of operations, RESULTS the JSON list of their outcomes ("ok", a value, or "<Exception type>: <message>"), PID the
worker's process id.

    {"family": name, "description": text, "kind": "COUNTER"|"GAUGE"|"HISTOGRAM"}   MetricFamily (kept by name)
    {"metric": key, "family": name, "labels": {...}, "buckets": [...]}            family.Metric (kept by key)
    {"do": "increment"|"set"|"observe"|"value", "metric": key, "value": v}        the metric's operation
    {"many": family, "count": n}            n metrics of labels {"i": "0"...}: "ok <n>", or the first refusal
    {"raise": family}                       MetricFamily(name=family, ...) not caught: the request fails
    {"finalize_marker": path}               finalize increments metrics_ops_workers, then writes `path`
    {"arrive": folder, "together": n}       write folder/<pid>, then wait until n workers wrote theirs (60 s at
                                            most): n requests in flight at once, each on a worker of its own

initialize makes `metrics_ops_workers` (a counter, labelled by nothing) and increments it: every worker started
adds one, which the server keeps across the model's workers and their restarts.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

KINDS = {
    "COUNTER": pb_utils.MetricFamily.COUNTER,
    "GAUGE": pb_utils.MetricFamily.GAUGE,
    "HISTOGRAM": pb_utils.MetricFamily.HISTOGRAM,
}


class TritonPythonModel:
    def initialize(self, args):
        self.workers = pb_utils.MetricFamily(
            name="metrics_ops_workers", description="Workers the model started", kind=pb_utils.MetricFamily.COUNTER
        )
        self.started = self.workers.Metric()
        self.started.increment(1)
        self.families = {}
        self.metrics = {}
        self.finalize_marker = None

    def finalize(self):
        if self.finalize_marker is not None:
            try:
                self.started.increment(1)  # answered by the server while it waits for this worker to end
                outcome = "ok"
            except Exception as error:
                outcome = f"{type(error).__name__}: {error}"
            Path(self.finalize_marker).write_text(outcome)

    def execute(self, requests):
        responses = []
        for request in requests:
            ops = json.loads(pb_utils.get_input_tensor_by_name(request, "OPS").as_numpy()[0])
            results = [self._outcome(op) for op in ops]
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("RESULTS", np.array([json.dumps(results)], dtype=np.object_)),
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                    ]
                )
            )
        return responses

    def _outcome(self, op):
        if "raise" in op:
            pb_utils.MetricFamily(name=op["raise"], description="refused", kind=pb_utils.MetricFamily.GAUGE)
            return "ok"
        try:
            return self._run(op)
        except Exception as error:  # the API's refusals are what the tests read
            return f"{type(error).__name__}: {error}"

    def _run(self, op):
        if "finalize_marker" in op:
            self.finalize_marker = op["finalize_marker"]
            return "ok"
        if "arrive" in op:
            folder = Path(op["arrive"])
            (folder / str(os.getpid())).write_text("")
            deadline = time.monotonic() + 60
            while len(list(folder.iterdir())) < op["together"]:
                if time.monotonic() > deadline:
                    return "the others never arrived"
                time.sleep(0.01)  # ordering-free: polls for the other workers' files until a deadline
            return "ok"
        if "family" in op and "metric" not in op:
            self.families[op["family"]] = pb_utils.MetricFamily(
                name=op["family"], description=op.get("description", "a test family"), kind=KINDS[op["kind"]]
            )
            return "ok"
        if "many" in op:
            family = self.families[op["many"]]
            for index in range(op["count"]):
                self.metrics[f"{op['many']}/{index}"] = family.Metric(labels={"i": str(index)})
            return f"ok {op['count']}"
        if "do" not in op:
            family = self.families[op["family"]]
            self.metrics[op["metric"]] = family.Metric(labels=op.get("labels"), buckets=op.get("buckets"))
            return "ok"
        metric = self.metrics[op["metric"]]
        if op["do"] == "value":
            return metric.value()
        getattr(metric, op["do"])(op["value"])
        return "ok"
