"""How long management calls wait for a model's earlier work, in behaviour and in the docs (issue 26): a single
model's RegisterModel or UnloadModel waits up to the model's admission timeout (then server_busy, nothing
changed); only a bulk unload waits without limit. docs/lifecycle.md and docs/operations.md say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.errors import AdmissionTimeout
from service.core.lifecycle import ModelState

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("call", ["unload", "register"])
def test_a_single_model_management_call_waits_up_to_the_admission_timeout_and_bulk_unload_without_limit(
    lab_factory, call
):
    lab = lab_factory({"a": {"capacity": 1}}, parallel_jobs=1, admission_timeout=0.25)
    execute = lab.gate("a", "execute").hold()
    holder = lab.infer("a", name="holder")
    execute.wait_blocked(1)
    bulk = lab.unload_many(["a"])
    lab.wait_queued("a", managers=1)
    single = lab.unload("a") if call == "unload" else lab.register("a", options={"marker": "new"})
    assert isinstance(single.error(), AdmissionTimeout)  # cut off after 0.25 s
    assert not bulk.done()  # the bulk barrier queued before it waits on, past the timeout
    assert lab.registry.get("a").spec.parameter("marker") is None  # the timed-out call changed nothing
    execute.release()
    holder.result()
    assert bulk.result() == (["a"], [])
    assert lab.status("a").state is ModelState.UNLOADED


def _row(page: str, call: str) -> str:
    rows = [line for line in (DOCS / page).read_text().splitlines() if line.startswith(f"| `{call}` |")]
    assert len(rows) == 1, f"{page}: expected one table row for {call}"
    return rows[0]


def _paragraph_with(page: str, words: str) -> str:
    """The paragraph of `page` that contains `words` (lines joined)."""
    paragraphs = [" ".join(p.split()) for p in (DOCS / page).read_text().split("\n\n")]
    found = [p for p in paragraphs if words in p]
    assert len(found) == 1, f"{page}: expected one paragraph with {words!r}, found {len(found)}"
    return found[0]


def test_the_docs_say_a_single_model_management_call_waits_up_to_the_admission_timeout():
    assert "admission timeout" in _row("lifecycle.md", "RegisterModel")
    assert "admission timeout" in _row("lifecycle.md", "UnloadModel")
    assert "waits without limit" in _row("lifecycle.md", "UnloadModels")
    timeouts = _paragraph_with("lifecycle.md", "Each model has an admission timeout")
    assert "RegisterModel and UnloadModel" in timeouts and "Bulk unload always waits without limit" in timeouts
    sizing = _paragraph_with("operations.md", "management calls (register, unload")
    assert "up to its admission timeout" in sizing and "a bulk unload without limit" in sizing
    assert "they can wait without limit" not in sizing  # the old claim, true of bulk unload only
