"""Generated call graphs of ensembles (which ensemble's steps name which model): self, mutual, long and nested
cycles, shared steps, cycles further down. The decision (engine/config/ensemble_graph.py call_graph_refusal, which the
server's load and `check` both use) is compared with an independent oracle (a transitive closure, no depth-first
search), and every cycle a refusal names is checked edge by edge against the graph. Then whole repositories of
such ensembles are served: each ensemble is READY and answers, or is listed UNAVAILABLE naming a real cycle, and
the server stays live with a bounded number of threads (tests/integration/ensembles/test_ensemble_cycles.py has the
named cases)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
from hypothesis import given, note, settings
from hypothesis import strategies as st

from engine.config.ensemble_graph import CYCLE_REFUSAL, call_graph_refusal
from engine.testing.fixture import FixtureBackend, FixtureControls
from service.testing import serve
from tests.integration._support import write_fixture_model
from tests.integration.ensembles.test_ensembles import F, write_ensemble

from .lab import FUZZ, examples

LEAF = "w"  # a fixture model (output = input): the step that is no ensemble


def graphs(size: int, max_steps: int) -> st.SearchStrategy[dict[str, list[str]]]:
    """Ensembles e0..e<n-1>, each with 1..max_steps steps naming ensembles (itself included) or the leaf."""
    names = st.integers(1, size).map(lambda n: [f"e{i}" for i in range(n)])
    return names.flatmap(
        lambda ensembles: st.fixed_dictionaries(
            {name: st.lists(st.sampled_from([*ensembles, LEAF]), min_size=1, max_size=max_steps) for name in ensembles}
        )
    )


def reaches_a_cycle(graph: dict[str, list[str]]) -> dict[str, bool]:
    """The oracle: ensemble n reaches a cycle when some m it reaches (n itself included) reaches m again through
    one step or more. Warshall's transitive closure over the ensembles."""
    names = list(graph)
    reach = {a: {b: b in graph[a] for b in names} for a in names}
    for k in names:
        for a in names:
            if reach[a][k]:
                for b in names:
                    if reach[k][b]:
                        reach[a][b] = True
    return {n: any((m == n or reach[n][m]) and reach[m][m] for m in names) for n in names}


def assert_names_a_real_cycle(graph: dict[str, list[str]], name: str, message: str) -> None:
    """The refusal's cycle (and the way to it) follow the graph's edges, from `name`."""
    assert message.startswith(f"{CYCLE_REFUSAL}: ensemble '{name}' "), message
    cycle = re.search(r"calls itself through (.+)$", message)
    assert cycle is not None, message
    ring = cycle.group(1).split(" -> ")
    assert ring[0] == ring[-1], message
    for caller, called in zip(ring, ring[1:], strict=False):
        assert called in graph[caller], (caller, called, message)
    way = re.search(r"calls ensemble '([^']+)' \(([^)]+)\)", message)
    if way is None:
        assert ring[0] == name, message
        return
    path = way.group(2).split(" -> ")
    assert path[0] == name and path[-1] == ring[0] == way.group(1), message
    for caller, called in zip(path, path[1:], strict=False):
        assert called in graph[caller], (caller, called, message)


@settings(FUZZ, max_examples=examples(600))
@given(graph=graphs(size=9, max_steps=4))
def test_the_decision_matches_an_independent_oracle(graph):
    note(repr(graph))
    expected = reaches_a_cycle(graph)
    for name in graph:
        message = call_graph_refusal(name, lambda model: graph.get(model, ()))
        assert (message is not None) == expected[name], (name, message)
        if message is not None:
            assert_names_a_real_cycle(graph, name, message)


@settings(FUZZ, max_examples=examples(20))
@given(size=st.integers(100, 3000), data=st.data())
def test_large_graphs_are_judged_without_recursion(size, data):
    ensembles = [f"e{i}" for i in range(size)]
    # mostly forward edges (long chains), and sometimes one edge back
    graph = {name: [ensembles[i + 1] if i + 1 < size else LEAF] for i, name in enumerate(ensembles)}
    back = data.draw(st.one_of(st.none(), st.tuples(st.integers(0, size - 1), st.integers(0, size - 1))))
    if back is not None:
        graph[ensembles[max(back)]].append(ensembles[min(back)])
    message = call_graph_refusal("e0", lambda model: graph.get(model, ()))
    assert message is not None  # a cycle, or a chain far deeper than MAX_NESTING
    assert len(message) < 400 and (CYCLE_REFUSAL in message) == (back is not None), message


def write_repository(root: Path, graph: dict[str, list[str]]) -> None:
    write_fixture_model(root, LEAF, inputs=[("INPUT0", "FP32", [-1])], outputs=[("OUTPUT0", "FP32", [-1])])
    for name, models in graph.items():
        steps = []
        for index, model in enumerate(models):
            source = "INPUT0" if index == 0 else f"t{index}"
            target = "OUTPUT0" if index == len(models) - 1 else f"t{index + 1}"
            steps.append((model, {"INPUT0": source}, {"OUTPUT0": target}))
        write_ensemble(root, name, [("INPUT0", F, [-1])], [("OUTPUT0", F, [-1])], steps)


@settings(FUZZ, max_examples=examples(12))
@given(graph=graphs(size=5, max_steps=3), lazy=st.booleans())
def test_served_repositories_load_what_has_no_cycle_and_name_every_cycle(tmp_path_factory, graph, lazy):
    note(repr(graph))
    expected = reaches_a_cycle(graph)
    root = tmp_path_factory.mktemp("ensemble-cycles")
    write_repository(root, graph)
    x = np.arange(3, dtype=np.float32)
    controls = FixtureControls()
    with serve(root, backends={"fixture": FixtureBackend(controls)}, load_at_startup=not lazy) as running:
        baseline = threading.active_count()
        for name in graph:
            try:
                answer = running.client.infer(name, {"INPUT0": x}, timeout=20)
                code, message = "OK", ""
            except Exception as error:  # noqa: BLE001 (ClientError: its code and message are checked)
                code, message = getattr(error, "code", repr(error)), getattr(error, "message", "")
            if expected[name]:
                assert code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"), (name, code, message)
                reason = {m.name: m for m in running.client.repository_index()}[name].reason
                assert_names_a_real_cycle(graph, name, reason)
                assert reason in message, (reason, message)
            else:
                assert code == "OK", (name, code, message)
                np.testing.assert_array_equal(answer["OUTPUT0"], x)
        assert running.client.live(timeout=5)
        assert threading.active_count() <= baseline + 8 * len(graph) + 4
