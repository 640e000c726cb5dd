"""Reading the clients' logs: every request and its final status, per kind and per model.

Each client log (soak/traffic.py, and the orchestrator's) holds a "sent" line per request and a "done" line per
final status. `audit_logs` finds requests without a final status, with more than one, and final statuses of
requests never sent; counts statuses per kind (infer, stream, mgmt); flags statuses that mean a server fault
(INTERNAL, UNKNOWN, a malformed response, a stream that ended without answering, a call that outlived its
deadline); and tallies, per model, what the clients saw, for soak/checks.py to reconcile with the server's own
counts.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .repository import REGISTERED, STREAMING_MODELS

FAULT_STATUSES = (
    "INTERNAL",
    "UNKNOWN",
    "MALFORMED_RESPONSE",
    "NO_ANSWER",
    "CLIENT_TIMEOUT",
    "DATA_LOSS",
    "UNIMPLEMENTED",
)
# What an op of soak/traffic.py is answered on purpose, though the status means a fault anywhere else: ModelInfer
# on a decoupled (streaming) model is UNIMPLEMENTED in Triton's words (docs/errors.md).
EXPECTED_STATUS = {"infer_streaming_model": "UNIMPLEMENTED"}


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    ok_abandoned: int = 0  # OK stream answers whose stream the client then cancelled (or whose deadline passed)
    gave_up: int = 0
    handler_busy: int = 0
    refused: int = 0  # any other status the server sent


@dataclass
class Audit:
    sent: int = 0
    done: int = 0
    missing: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    odd_events: list[str] = field(default_factory=list)
    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # kind -> status counts
    ops: Counter = field(default_factory=Counter)  # "op status" of management calls
    per_model: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    faults: list[str] = field(default_factory=list)


def audit_logs(paths: list[Path]) -> Audit:
    audit = Audit()
    for path in paths:
        sent: dict[str, dict] = {}
        done: dict[str, list[dict]] = defaultdict(list)
        with path.open() as handle:
            for line in handle:
                record = json.loads(line)
                if record["event"] == "sent":
                    sent[record["id"]] = record
                elif record["event"] == "done":
                    done[record["id"]].append(record)
                else:
                    audit.odd_events.append(f"{path.name}: {line.strip()[:200]}")
        audit.sent += len(sent)
        audit.done += sum(len(v) for v in done.values())
        audit.missing += [i for i in sent if i not in done]
        audit.duplicated += [i for i, v in done.items() if len(v) > 1]
        audit.orphans += [i for i in done if i not in sent]
        for request_id, request in sent.items():
            if request_id not in done:
                continue
            final = done[request_id][0]
            status, kind = final["status"], request["kind"]
            audit.statuses[kind][status] += 1
            if status in FAULT_STATUSES and EXPECTED_STATUS.get(request["op"]) != status:
                audit.faults.append(
                    f"{request_id} {kind} {request['model']} {request['op']}: {status} {final.get('message', '')}"
                )
            if kind == "mgmt":
                audit.ops[f"{request['op']} {status}"] += 1
                continue
            if request["model"] not in REGISTERED:
                continue  # unknown model names: counted server-wide, not under a model
            tally = audit.per_model[request["model"]]
            tally.sent += 1
            if status == "OK":
                tally.ok += 1
                # Only a streaming model's last answer can be OK at the client yet uncounted (note 1).
                tally.ok_abandoned += bool(final.get("abandoned_after")) and request["model"] in STREAMING_MODELS
            elif final["gave_up"]:
                tally.gave_up += 1
            elif final["handler_busy"]:
                tally.handler_busy += 1
            else:
                tally.refused += 1
    return audit
