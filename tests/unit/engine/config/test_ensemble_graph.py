"""An ensemble's graph is checked when its configuration is read (engine/config/ensemble_graph.py read_steps,
through the repository) and against its step models when it loads (check_against_models): each refusal names the
step, the tensor or the model."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config.ensemble_graph import (
    CYCLE_REFUSAL,
    MAX_NESTING,
    StepModel,
    call_graph_refusal,
    call_graph_refusals,
    check_against_models,
    ensembles_after_their_steps,
    read_steps,
    step_models,
)
from engine.config.repository import ModelRepository, parse_config_text
from engine.config.specs import TensorSpec
from engine.errors import ModelConfigError

HEAD = 'name: "e"\nplatform: "ensemble"\nmax_batch_size: 0\n'
TENSORS = textwrap.dedent(
    """
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """
)


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {maps} }}'


def config_text(*steps: str, head: str = HEAD, tensors: str = TENSORS) -> str:
    return head + tensors + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }\n"


CHAIN = (step("a", {"IN": "X"}, {"OUT": "t"}), step("b", {"IN": "t"}, {"OUT": "Y"}))


def steps_of(text: str):
    return read_steps(parse_config_text(text, "ensemble 'e'"), "ensemble 'e'")


def refused(text: str) -> str:
    with pytest.raises(ModelConfigError) as error:
        steps_of(text)
    return str(error.value)


def test_a_chain_reads_in_order_with_its_maps():
    steps = steps_of(config_text(*CHAIN))
    assert [(s.model, s.version, dict(s.inputs), dict(s.outputs)) for s in steps] == [
        ("a", -1, {"IN": "X"}, {"OUT": "t"}),
        ("b", -1, {"IN": "t"}, {"OUT": "Y"}),
    ]
    assert steps[0].version_string == "" and steps[0].label == "step 0 (model 'a')"


def test_no_steps_is_refused():
    assert "at least one step" in refused(HEAD + TENSORS + "ensemble_scheduling { }\n")


def test_a_step_without_a_model_is_refused():
    assert "step 1 names no model" in refused(config_text(CHAIN[0], '{ input_map { key: "I" value: "t" } }'))


def test_a_version_below_minus_one_is_refused():
    message = refused(config_text(step("a", {"IN": "X"}, {"OUT": "Y"}, version=-2)))
    assert "step 0 (model 'a'): model_version must be -1 (latest) or a version number, got -2" in message


def test_a_tensor_produced_twice_is_refused_naming_both_producers():
    message = refused(config_text(*CHAIN, step("c", {"IN": "X"}, {"OUT": "t"})))
    assert "tensor 't' is produced twice: by step 0 (model 'a') and by step 2 (model 'c') (output 'OUT')" in message


def test_a_step_writing_an_ensemble_input_is_refused():
    message = refused(config_text(step("a", {"IN": "X"}, {"OUT": "X"}), CHAIN[1]))
    assert "tensor 'X' is produced twice: by the ensemble's inputs and by step 0 (model 'a')" in message


def test_a_step_reading_a_tensor_nothing_produces_is_refused():
    message = refused(config_text(CHAIN[0], step("b", {"IN": "nowhere"}, {"OUT": "Y"})))
    assert "step 1 (model 'b') input 'IN' reads tensor 'nowhere', which neither an ensemble input nor" in message


def test_an_ensemble_output_no_step_produces_is_refused():
    message = refused(config_text(step("a", {"IN": "X"}, {"OUT": "t"}), step("b", {"IN": "t"}, {"OUT": "u"})))
    assert "ensemble output 'Y' is produced by no step" in message


def test_a_cycle_is_refused_naming_its_steps():
    cycle = (
        step("a", {"IN": "X", "BACK": "v"}, {"OUT": "t"}),
        step("b", {"IN": "t"}, {"OUT": "u"}),
        step("c", {"IN": "u"}, {"OUT": "v", "OUT2": "Y"}),
    )
    message = refused(config_text(*cycle))
    assert "the steps form a cycle:" in message
    for label in ("step 0 (model 'a')", "step 1 (model 'b')", "step 2 (model 'c')"):
        assert label in message


def test_an_ensemble_without_declared_tensors_is_refused():
    assert "declares its inputs and outputs" in refused(config_text(*CHAIN, tensors=""))


def test_model_namespace_is_refused_by_name(tmp_path):
    text = config_text(
        '{ model_name: "a" model_namespace: "ns" input_map { key: "IN" value: "X" } '
        'output_map { key: "OUT" value: "Y" } }'
    )
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.pbtxt").write_text(text)
    with pytest.raises(ModelConfigError) as error:
        ModelRepository(tmp_path).read("e")
    assert "ensemble_scheduling.step[0].model_namespace: not supported" in str(error.value)


def test_the_repository_refuses_a_bad_graph_when_it_reads_the_config(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.pbtxt").write_text(config_text(CHAIN[0], step("b", {"IN": "t"}, {"OUT": "u"})))
    with pytest.raises(ModelConfigError) as error:
        ModelRepository(tmp_path).read("e")
    assert "model 'e': ensemble output 'Y' is produced by no step" in str(error.value)


def test_ensemble_scheduling_without_the_ensemble_platform_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    text = 'name: "m"\nbackend: "fixture"\n' + TENSORS + "ensemble_scheduling { step [ " + CHAIN[0] + " ] }\n"
    (tmp_path / "m" / "config.pbtxt").write_text(text)
    with pytest.raises(ModelConfigError) as error:
        ModelRepository(tmp_path).read("m")
    assert 'ensemble_scheduling needs platform: "ensemble"' in str(error.value)


# ---- against the step models ---------------------------------------------------------------------------------


def fp32(name: str, *dims: int) -> TensorSpec:
    return TensorSpec(name, "FP32", tuple(dims))


PLAIN = StepModel(0, (fp32("IN", 4),), (fp32("OUT", 4),))
X4, Y4 = (fp32("X", 4),), (fp32("Y", 4),)


def check(models: dict, *, batch: int = 0, steps=CHAIN, inputs=X4, outputs=Y4) -> bool:
    graph = steps_of(config_text(*steps, head=HEAD.replace("max_batch_size: 0", f"max_batch_size: {batch}")))

    def model_of(s):
        if s.model not in models:
            raise ModelConfigError(f"ensemble 'e': {s.label} names a model that is not registered")
        return models[s.model]

    return check_against_models("ensemble 'e'", batch, inputs, outputs, graph, model_of)


def check_refusal(models: dict, **kwargs) -> str:
    with pytest.raises(ModelConfigError) as error:
        check(models, **kwargs)
    return str(error.value)


def test_agreeing_models_pass():
    check({"a": PLAIN, "b": PLAIN})


def test_an_unknown_step_model_is_refused_by_name():
    assert "step 1 (model 'b') names a model that is not registered" in check_refusal({"a": PLAIN})


def test_a_datatype_mismatch_is_refused_naming_the_tensor_and_both_sides():
    b = StepModel(0, (TensorSpec("IN", "INT32", (4,)),), (fp32("OUT", 4),))
    message = check_refusal({"a": PLAIN, "b": b})
    assert "tensor 't' is FP32 from step 0 (model 'a') output, but step 1 (model 'b') input expects INT32" in message


def test_a_shape_mismatch_is_refused_and_a_variable_dimension_agrees():
    b = StepModel(0, (fp32("IN", 5),), (fp32("OUT", 4),))
    message = check_refusal({"a": PLAIN, "b": b})
    assert (
        "tensor 't' has shape [4] from step 0 (model 'a') output, but step 1 (model 'b') input expects [5]" in message
    )
    check({"a": PLAIN, "b": StepModel(0, (fp32("IN", -1),), (fp32("OUT", 4),))})


def test_an_ensemble_output_disagreeing_with_its_producer_is_refused():
    b = StepModel(0, (fp32("IN", 4),), (fp32("OUT", 3),))
    assert "but the ensemble's output expects [4]" in check_refusal({"a": PLAIN, "b": b})


def test_a_map_naming_a_tensor_the_model_lacks_is_refused():
    b = StepModel(0, (fp32("OTHER", 4),), (fp32("OUT", 4),))
    assert "step 1 (model 'b') maps input 'IN', which the model does not take" in check_refusal({"a": PLAIN, "b": b})
    b = StepModel(0, (fp32("IN", 4),), (fp32("ELSE", 4),))
    assert "maps output 'OUT', which the model does not produce" in check_refusal({"a": PLAIN, "b": b})


DECOUPLED = StepModel(0, (fp32("IN", 4),), (fp32("OUT", 4),), decoupled=True)
TWO_IN = StepModel(0, (fp32("IN", 4), fp32("IN2", 4)), (fp32("OUT", 4),))
MIXED = "receives inputs originated from different decoupled models"  # Triton's words


def test_an_ensemble_with_a_decoupled_step_is_decoupled_itself():
    assert check({"a": PLAIN, "b": DECOUPLED}) is True
    assert check({"a": DECOUPLED, "b": PLAIN}) is True
    assert check({"a": PLAIN, "b": PLAIN}) is False


def test_a_step_reading_a_decoupled_steps_values_and_the_requests_is_refused_in_tritons_words():
    steps = (step("a", {"IN": "X"}, {"OUT": "t"}), step("b", {"IN": "t", "IN2": "X"}, {"OUT": "Y"}))
    message = check_refusal({"a": DECOUPLED, "b": TWO_IN}, steps=steps)
    assert (
        f"ensemble 'e': step 1 (model 'b') {MIXED} ('t' from step 0 (model 'a') (decoupled), 'X' from the " in message
    )
    assert check({"a": PLAIN, "b": TWO_IN}, steps=steps) is False


def test_values_of_two_decoupled_steps_meeting_are_refused_and_through_plain_steps_too():
    steps = (
        step("a", {"IN": "X"}, {"OUT": "t"}),
        step("c", {"IN": "X"}, {"OUT": "u"}),
        step("p", {"IN": "u"}, {"OUT": "v"}),  # plain: its output keeps the origin of its input (c)
        step("b", {"IN": "t", "IN2": "v"}, {"OUT": "Y"}),
    )
    message = check_refusal({"a": DECOUPLED, "c": DECOUPLED, "p": PLAIN, "b": TWO_IN}, steps=steps)
    assert (
        f"step 3 (model 'b') {MIXED} ('t' from step 0 (model 'a') (decoupled), 'v' from step 1 (model 'c')" in message
    )


def test_the_ensembles_outputs_of_different_origins_are_refused():
    steps = (step("a", {"IN": "X"}, {"OUT": "Y"}), step("b", {"IN": "X"}, {"OUT": "Z"}))
    outputs = (fp32("Y", 4), fp32("Z", 4))
    text = HEAD + TENSORS.replace(
        'output [ { name: "Y"', 'output [ { name: "Z" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "Y"'
    )
    graph = steps_of(text + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }\n")
    with pytest.raises(ModelConfigError, match=f"ensemble 'e', as the step collecting its outputs, {MIXED}"):
        check_against_models("ensemble 'e'", 0, X4, outputs, graph, lambda s: {"a": DECOUPLED, "b": PLAIN}[s.model])


def test_a_decoupled_step_after_another_starts_a_new_origin_that_its_readers_share():
    steps = (
        step("b", {"IN": "t"}, {"OUT": "u"}),  # listed first: the check follows the data, not the list
        step("a", {"IN": "X"}, {"OUT": "t"}),
        step("c", {"IN": "u", "IN2": "u"}, {"OUT": "Y"}),
    )
    assert check({"a": DECOUPLED, "b": DECOUPLED, "c": TWO_IN}, steps=steps) is True


def test_a_step_version_other_than_the_served_one_is_refused():
    steps = (step("a", {"IN": "X"}, {"OUT": "t"}, version=3), CHAIN[1])
    a = StepModel(0, (fp32("IN", 4),), (fp32("OUT", 4),), version="1")
    message = check_refusal({"a": a, "b": PLAIN}, steps=steps)
    assert "step 0 (model 'a') asks for version 3; the model serves version 1" in message


def test_tritons_max_batch_size_rules():
    batching = StepModel(8, (fp32("IN", 4),), (fp32("OUT", 4),))
    small = StepModel(2, (fp32("IN", 4),), (fp32("OUT", 4),))
    check({"a": batching, "b": batching}, batch=8)
    message = check_refusal({"a": batching, "b": PLAIN}, batch=4)
    assert "the ensemble allows maximum batch size 4, but step 1 (model 'b') does not support batching" in message
    message = check_refusal({"a": batching, "b": small}, batch=4)
    assert "maximum batch size 4, but step 1 (model 'b') only allows maximum batch size 2" in message


def test_a_batching_step_in_an_ensemble_that_does_not_batch_carries_its_batch_dimension():
    batching = StepModel(8, (fp32("IN", 4),), (fp32("OUT", 4),))
    # The step sees [-1, 4]; the ensemble's [4] input does not fit it, a [2, 4] input does.
    assert "expects [-1, 4]" in check_refusal({"a": batching, "b": batching})
    check({"a": batching, "b": batching}, inputs=(fp32("X", 2, 4),), outputs=(fp32("Y", 2, 4),))


def test_a_step_whose_tensors_are_known_only_after_loading_is_checked_at_run_time():
    unknown = StepModel(0, (), ())
    check({"a": unknown, "b": PLAIN})


def test_a_chain_of_thousands_of_steps_is_read_without_recursion():
    length = 3000
    steps = [
        step("m", {"IN": "X" if i == 0 else f"t{i}"}, {"OUT": "Y" if i == length - 1 else f"t{i + 1}"})
        for i in range(length)
    ]
    assert len(steps_of(config_text(*steps))) == length
    # listed last step first: the recursive check followed producers 3000 deep (RecursionError, limit 1000)
    assert len(steps_of(config_text(*reversed(steps)))) == length
    looped = [step("m", {"IN": "X", "LOOP": f"t{length - 1}"}, {"OUT": "t1"}), *steps[1:]]  # a cycle of 2999
    message = refused(config_text(*looped))
    assert "the steps form a cycle: step 0 (model 'm') -> step 1 (model 'm') -> " in message
    assert len(message) < 400, message  # a long cycle is shortened, not listed in full


# ---- the ensembles' call graph (call_graph_refusal) --------------------------------------------------------------


def refusal(graph: dict[str, list[str]], name: str) -> str | None:
    return call_graph_refusal(name, lambda model: graph.get(model, ()))


def test_an_ensemble_calling_itself_is_refused_naming_the_cycle_in_tritons_words():
    assert CYCLE_REFUSAL == "circular dependency between ensembles"
    assert refusal({"a": ["w", "a"]}, "a") == f"{CYCLE_REFUSAL}: ensemble 'a' calls itself through a -> a"


def test_mutual_and_longer_cycles_are_named_from_the_ensemble_loading():
    graph = {"a": ["w", "b"], "b": ["a"], "l1": ["l2"], "l2": ["x", "l3"], "l3": ["l1"]}
    assert refusal(graph, "a") == f"{CYCLE_REFUSAL}: ensemble 'a' calls itself through a -> b -> a"
    assert refusal(graph, "b") == f"{CYCLE_REFUSAL}: ensemble 'b' calls itself through b -> a -> b"
    assert refusal(graph, "l2") == f"{CYCLE_REFUSAL}: ensemble 'l2' calls itself through l2 -> l3 -> l1 -> l2"


def test_an_ensemble_reaching_a_cycle_it_is_not_on_is_refused_naming_the_way_there():
    graph = {"c": ["w", "d"], "d": ["a"], "a": ["b"], "b": ["a"]}
    assert refusal(graph, "c") == (
        f"{CYCLE_REFUSAL}: ensemble 'c' calls ensemble 'a' (c -> d -> a), which calls itself through a -> b -> a"
    )


def test_graphs_without_cycles_pass_shared_steps_included():
    diamond = {"top": ["left", "right"], "left": ["bottom"], "right": ["bottom"], "bottom": ["w"]}
    assert refusal(diamond, "top") is None
    assert refusal({}, "lonely") is None


def test_each_model_is_asked_once():
    asked: list[str] = []
    graph = {"top": ["left", "right"], "left": ["bottom", "w"], "right": ["bottom", "w"], "bottom": ["w"]}

    def steps_of_model(model: str) -> list[str]:
        asked.append(model)
        return graph.get(model, [])

    assert call_graph_refusal("top", steps_of_model) is None
    assert sorted(asked) == ["bottom", "left", "right", "top", "w"]


def test_a_chain_of_ensembles_longer_than_the_limit_is_refused_naming_it():
    chain = {f"e{i}": [f"e{i + 1}"] for i in range(1, MAX_NESTING)}  # e1 .. e<MAX_NESTING>; the last calls w
    chain[f"e{MAX_NESTING}"] = ["w"]
    assert refusal(chain, "e1") is None
    chain[f"e{MAX_NESTING}"] = [f"e{MAX_NESTING + 1}"]
    chain[f"e{MAX_NESTING + 1}"] = ["w"]
    message = refusal(chain, "e1")
    assert message is not None and message.startswith(f"ensemble 'e1' nests {MAX_NESTING + 1} ensembles deep (e1 -> e2")
    assert refusal(chain, "e2") is None


def test_huge_graphs_are_judged_without_recursion_and_named_briefly():
    size = 20000
    ring = {f"e{i}": [f"e{(i + 1) % size}"] for i in range(size)}
    message = refusal(ring, "e0")
    assert message is not None and message.startswith(f"{CYCLE_REFUSAL}: ensemble 'e0' calls itself through e0 -> e1")
    assert f"({size - 10} more) -> e{size - 1} -> e0" in message and len(message) < 300
    line = {f"e{i}": [f"e{i + 1}"] for i in range(size)}
    message = refusal(line, "e0")
    assert message is not None and f"nests {size} ensembles deep" in message and len(message) < 300


def test_a_whole_repository_is_judged_at_once_for_check():
    graph = {"a": ["b"], "b": ["a"], "c": ["w"], "d": ["a"]}
    assert call_graph_refusals(graph) == {
        "a": f"{CYCLE_REFUSAL}: ensemble 'a' calls itself through a -> b -> a",
        "b": f"{CYCLE_REFUSAL}: ensemble 'b' calls itself through b -> a -> b",
        "d": f"{CYCLE_REFUSAL}: ensemble 'd' calls ensemble 'a' (d -> a), which calls itself through a -> b -> a",
    }


def test_step_models_lists_each_model_once_in_step_order():
    text = config_text(
        step("b", {"IN": "X"}, {"OUT": "t"}), step("a", {"IN": "t"}, {"OUT": "u"}), step("b", {"IN": "u"}, {"OUT": "Y"})
    )
    assert step_models(parse_config_text(text, "e")) == ("b", "a")


def test_a_reload_that_changes_only_the_steps_is_a_new_engine(tmp_path):
    (tmp_path / "e" / "1").mkdir(parents=True)
    (tmp_path / "e" / "config.pbtxt").write_text(config_text(*CHAIN))
    before = ModelRepository(tmp_path).read("e")
    (tmp_path / "e" / "config.pbtxt").write_text(config_text(CHAIN[0], step("c", {"IN": "t"}, {"OUT": "Y"})))
    after = ModelRepository(tmp_path).read("e")
    assert (before.inputs, before.outputs) == (after.inputs, after.outputs)
    assert before.session_key() != after.session_key()  # a reload loads (and checks) the new steps
    assert after.session_key() == ModelRepository(tmp_path).read("e").session_key()  # the same steps: the same


# ---- load order (engine/config/repository.py load_order) ------------------------------------------------------------


def recursive_order(names: list[str], steps: dict[str, list[str]]) -> list[str]:
    """The order load_order gave before it was made iterative (its recursive definition, kept as the reference)."""
    ordered: list[str] = []
    placed: set[str] = set()

    def place(name: str, path: frozenset[str]) -> None:
        if name in placed or name in path:
            return
        for called in steps.get(name, ()):
            if called in steps:
                place(called, path | {name})
        placed.add(name)
        ordered.append(name)

    for name in [n for n in names if n not in steps] + [n for n in names if n in steps]:
        place(name, frozenset())
    return ordered


@settings(deadline=None, max_examples=300)
@given(data=st.data())
def test_the_load_order_puts_each_ensemble_after_the_ones_it_calls_as_before(data):
    names = data.draw(st.lists(st.sampled_from([f"m{i}" for i in range(8)]), min_size=1, max_size=10, unique=True))
    ensembles = data.draw(st.sets(st.sampled_from(names)))
    steps = {e: data.draw(st.lists(st.sampled_from([*names, "elsewhere"]), min_size=1, max_size=4)) for e in ensembles}
    assert ensembles_after_their_steps(names, steps) == recursive_order(names, steps)


def test_a_repository_with_a_chain_of_a_thousand_ensembles_is_ordered_without_recursion(tmp_path):
    length = 1200  # the recursive order hit Python's recursion limit here, and the server did not start
    for level in range(length):
        (tmp_path / f"e{level}" / "1").mkdir(parents=True)
        called = f"e{level + 1}" if level + 1 < length else "w"
        (tmp_path / f"e{level}" / "config.pbtxt").write_text(
            config_text(step(called, {"IN": "X"}, {"OUT": "Y"}), head=f'name: "e{level}"\nplatform: "ensemble"\n')
        )
    repository = ModelRepository(tmp_path)
    order = repository.load_order(repository.names())
    assert order == [f"e{level}" for level in reversed(range(length))]
