"""soak/audit.py: the clients' logs are read into one final status per request, faults and per-model tallies."""

from __future__ import annotations

import json

from soak.audit import audit_logs


def write_log(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def sent(request_id, model="simple", kind="infer"):
    return {"event": "sent", "id": request_id, "kind": kind, "model": model, "op": "infer", "t": 0}


def done(request_id, status="OK", **flags):
    return {
        "event": "done",
        "id": request_id,
        "status": status,
        "reason": None,
        "gave_up": False,
        "handler_busy": False,
        "abandoned_after": False,
        "message": "",
        "t": 0,
        **flags,
    }


def test_every_request_needs_exactly_one_final_status(tmp_path):
    log = write_log(
        tmp_path / "c0.jsonl",
        [
            sent("a"),
            done("a"),
            sent("b"),  # never answered
            sent("c"),
            done("c"),
            done("c", status="UNAVAILABLE"),  # answered twice
            done("d"),  # answered, never sent
            {"event": "odd", "id": "e"},
        ],
    )
    audit = audit_logs([log])
    assert (audit.sent, audit.done) == (3, 4)
    assert (audit.missing, audit.duplicated, audit.orphans) == (["b"], ["c"], ["d"])
    assert len(audit.odd_events) == 1


def test_faults_and_per_model_tallies(tmp_path):
    log = write_log(
        tmp_path / "c1.jsonl",
        [
            sent("a"),
            done("a"),
            sent("b"),
            done("b", status="INTERNAL"),
            sent("c"),
            done("c", status="DEADLINE_EXCEEDED", gave_up=True),
            sent("d"),
            done("d", status="UNAVAILABLE", handler_busy=True),
            sent("e", model="no_such_model"),
            done("e", status="NOT_FOUND"),
            sent("f", kind="mgmt"),
            done("f"),
        ],
    )
    audit = audit_logs([log])
    assert [fault.split()[0] for fault in audit.faults] == ["b"]
    tally = audit.per_model["simple"]
    assert (tally.sent, tally.ok, tally.gave_up, tally.handler_busy, tally.refused) == (4, 1, 1, 1, 1)
    assert "no_such_model" not in audit.per_model  # unknown names are counted server-wide, not per model
    assert audit.statuses["mgmt"] == {"OK": 1} and audit.ops == {"infer OK": 1}


def test_a_streaming_model_called_unary_is_refused_as_triton_does_and_that_is_no_fault(tmp_path):
    """ModelInfer on a decoupled model answers UNIMPLEMENTED in Triton's words (docs/errors.md): the soak's
    `infer_streaming_model` op expects it. UNIMPLEMENTED anywhere else still means a server fault."""
    expected = dict(sent("a", model="fx_stream"), op="infer_streaming_model")
    elsewhere = dict(sent("b", model="fx_echo"), op="infer")
    log = write_log(
        tmp_path / "c2.jsonl",
        [expected, done("a", status="UNIMPLEMENTED"), elsewhere, done("b", status="UNIMPLEMENTED")],
    )
    audit = audit_logs([log])
    assert [fault.split()[0] for fault in audit.faults] == ["b"]
    assert audit.per_model["fx_stream"].refused == 1
