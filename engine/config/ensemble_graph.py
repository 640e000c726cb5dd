"""An ensemble's graph (config.pbtxt `platform: "ensemble"` with `ensemble_scheduling { step [...] }`): reading it
and checking it. Pure: no threads, no server.

Two checks, each refusal a ModelConfigError naming the step, the tensor or the model:

* `read_steps` (when the configuration is read): at least one step; each step names a model, a version (-1 =
  latest, or a number), and maps inputs and outputs; every ensemble tensor is produced once (by the ensemble's
  inputs or by one step's output_map); every step input is produced by something; every ensemble output is produced
  by a step; the steps form no cycle.
* `check_against_models` (when the ensemble loads, with the step models' declared tensors): every step model is
  known and has the inputs and outputs its maps name; the datatypes and shapes of each tensor agree between its
  producer and every consumer; Triton's max_batch_size rules for ensembles (an ensemble that batches needs every
  step model to batch at least as far); Triton's rule for decoupled steps (no step, and not the ensemble's outputs,
  reads values that descend from different decoupled steps, or from one and from the request). It says whether the
  ensemble is decoupled: when any step is (a decoupled model, or an ensemble that is decoupled itself).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from generated import model_config_pb2

from ..errors import ModelConfigError
from .specs import TensorSpec

LATEST = -1  # model_version of a step that runs the model's served (latest) version


@dataclass(frozen=True)
class Step:
    """One step: the model it runs and how its tensors connect to the ensemble's."""

    index: int
    model: str
    version: int  # -1: the latest
    inputs: Mapping[str, str]  # step model's input -> ensemble tensor feeding it
    outputs: Mapping[str, str]  # step model's output -> ensemble tensor it produces

    @property
    def label(self) -> str:
        """How messages name the step: `step 1 (model 'm')`, counted from 0 as in the config's list."""
        return f"step {self.index} (model '{self.model}')"

    @property
    def version_string(self) -> str:
        """The version a step call asks for: '' (the served one) for -1."""
        return "" if self.version == LATEST else str(self.version)


@dataclass(frozen=True)
class StepModel:
    """What the load check needs to know of a step model (from its registered spec or its loaded metadata)."""

    max_batch_size: int
    inputs: tuple[TensorSpec, ...]  # empty with outputs: the tensors are not known before the model loads
    outputs: tuple[TensorSpec, ...]
    decoupled: bool = False  # answers a request with any number of responses (a decoupled ensemble included)
    version: str = ""


def read_steps(config: Any, origin: str) -> tuple[Step, ...]:  # Any: ModelSpec.config is typed object
    """The steps of an ensemble's config (an inference.ModelConfig with platform 'ensemble'), checked as a graph.
    Raises ModelConfigError naming the first problem."""
    blocks = list(config.ensemble_scheduling.step)
    if not blocks:
        raise ModelConfigError(f"{origin}: an ensemble needs ensemble_scheduling with at least one step")
    steps = tuple(_step(index, block, origin) for index, block in enumerate(blocks))
    inputs = [t.name for t in config.input]
    outputs = [t.name for t in config.output]
    if not inputs or not outputs:
        raise ModelConfigError(f"{origin}: an ensemble declares its inputs and outputs (input and output blocks)")
    producers = _producers(steps, inputs, origin)
    for step in steps:
        for model_input, tensor in step.inputs.items():
            if tensor not in producers:
                raise ModelConfigError(
                    f"{origin}: {step.label} input '{model_input}' reads tensor '{tensor}', which neither an "
                    "ensemble input nor any step produces"
                )
    for name in outputs:
        if name not in producers or producers[name] is None:
            raise ModelConfigError(f"{origin}: ensemble output '{name}' is produced by no step")
    _check_acyclic(steps, producers, origin)
    return steps


def _step(index: int, block: model_config_pb2.ModelEnsembling.Step, origin: str) -> Step:
    where = f"{origin}: step {index}"
    if not block.model_name:
        raise ModelConfigError(f"{where} names no model (model_name)")
    if block.model_namespace:
        raise ModelConfigError(f"{where} (model '{block.model_name}'): model_namespace is not supported")
    if block.model_version < LATEST:
        raise ModelConfigError(
            f"{where} (model '{block.model_name}'): model_version must be -1 (latest) or a version number, "
            f"got {block.model_version}"
        )
    # By name: a protobuf map iterates in an order its hashing decides (it changed with PYTHONHASHSEED), and the
    # refusals that list a step's inputs must read the same on every run.
    inputs, outputs = dict(sorted(block.input_map.items())), dict(sorted(block.output_map.items()))
    step = Step(index, block.model_name, int(block.model_version), inputs, outputs)
    if not step.inputs or not step.outputs:
        raise ModelConfigError(f"{origin}: {step.label} needs an input_map and an output_map")
    return step


def _producers(steps: Sequence[Step], inputs: Sequence[str], origin: str) -> dict[str, Step | None]:
    """Ensemble tensor -> the step producing it (None: an ensemble input). Raises for a tensor produced twice."""
    producers: dict[str, Step | None] = dict.fromkeys(inputs)
    for step in steps:
        for model_output, tensor in step.outputs.items():
            if tensor in producers:
                earlier = producers[tensor]
                by = "the ensemble's inputs" if earlier is None else earlier.label
                raise ModelConfigError(
                    f"{origin}: tensor '{tensor}' is produced twice: by {by} and by {step.label} "
                    f"(output '{model_output}')"
                )
            producers[tensor] = step
    return producers


def _check_acyclic(steps: Sequence[Step], producers: Mapping[str, Step | None], origin: str) -> None:
    """Raise naming the steps of a cycle, in data-flow order, if the steps' tensors form one. Iterative: a chain
    of any length is checked without recursion."""
    consumers: dict[int, list[int]] = {step.index: [] for step in steps}
    for step in steps:
        for tensor in dict.fromkeys(step.inputs.values()):
            producer = producers.get(tensor)
            if producer is not None:
                consumers[producer.index].append(step.index)
    done: set[int] = set()
    for step in steps:
        found = _find_cycle(step.index, consumers.__getitem__, done)
        if found is not None:
            names = _arrows([steps[index].label for index in found[1]])
            raise ModelConfigError(f"{origin}: the steps form a cycle: {names}")


_END = object()


def _find_cycle(
    start: Hashable, successors: Callable[[Any], Iterable[Any]], done: set[Any] | None = None
) -> tuple[list[Any], list[Any]] | None:
    """Depth first from `start` (an explicit stack: no recursion whatever the graph's size): None when no cycle is
    reachable, else (the path from `start` to the cycle's first node, both included; the cycle's nodes in order,
    its first node repeated at the end). `done` (shared between calls) holds nodes already known to reach no
    cycle; those visited here are added."""
    done = set() if done is None else done
    if start in done:
        return None
    path: list[Any] = [start]
    on_path: dict[Any, int] = {start: 0}
    pending: list[Iterator[Any]] = [iter(successors(start))]
    while pending:
        node = next(pending[-1], _END)
        if node is _END:
            pending.pop()
            finished = path.pop()
            del on_path[finished]
            done.add(finished)
        elif node in on_path:
            first = on_path[node]
            return path[: first + 1], [*path[first:], node]
        elif node not in done:
            on_path[node] = len(path)
            path.append(node)
            pending.append(iter(successors(node)))
    return None


# ---- the ensembles' call graph ---------------------------------------------------------------------------------

# The longest chain of ensembles calling ensembles that loads. Each level runs its first ready step on the calling
# thread (service/ensemble.py), about 10 Python frames deeper per level (measured: 24 frames at the step model of
# one ensemble, 174 at the end of a chain of 16); 16 levels stay far below Python's recursion limit (1000).
MAX_NESTING = 16

CYCLE_REFUSAL = "circular dependency between ensembles"  # Triton's words, which every cycle refusal starts with


def step_models(config: Any) -> tuple[str, ...]:
    """The models an ensemble's steps name, each once, in step order (`config`: its inference.ModelConfig)."""
    return tuple(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def call_graph_refusal(name: str, steps_of: Callable[[str], Iterable[str]]) -> str | None:
    """Why ensemble `name` must not load because of the ensembles it calls, or None. `steps_of(model)` gives the
    models the steps of ensemble `model` name (step_models of its config), and nothing for a model that is not an
    ensemble or is unknown; it is asked once per model.

    Refused, in this order: a cycle of ensembles reachable from `name`, through any number of steps and whatever
    versions they name (an ensemble that calls itself, two that call each other, longer ones, or a cycle further
    down: its request would call the cycle forever), named from `name` (`circular dependency between ensembles:
    ensemble 'a' calls itself through a -> b -> a`); a chain of ensembles calling ensembles longer than
    MAX_NESTING, named. Never raises, never recurses (the server's load and `python -m service check` call it)."""
    known: dict[str, tuple[str, ...]] = {}

    def called(model: str) -> tuple[str, ...]:
        if model not in known:
            known[model] = tuple(dict.fromkeys(steps_of(model)))
        return known[model]

    found = _find_cycle(name, called)
    if found is not None:
        return _cycle_message(name, *found)
    chain = _deepest_chain(name, called)
    if len(chain) > MAX_NESTING:
        return (
            f"ensemble '{name}' nests {len(chain)} ensembles deep ({_arrows(chain)}); at most {MAX_NESTING} "
            "ensembles may call each other in a chain"
        )
    return None


def call_graph_refusals(graph: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """call_graph_refusal for every ensemble of a whole repository at once: `graph` maps each ensemble's name to
    the models its steps name (models that are not ensembles are left out). Returns {ensemble: why it is
    refused} for those refused; the others load as far as their call graph goes."""
    refusals = {}
    for name in graph:
        refusal = call_graph_refusal(name, lambda model: graph.get(model, ()))
        if refusal is not None:
            refusals[name] = refusal
    return refusals


def ensembles_after_their_steps(names: Sequence[str], steps: Mapping[str, Sequence[str]]) -> list[str]:
    """`names` in a load order (engine/config/repository.py load_order): the models that are not ensembles (not keys of
    `steps`, which maps each ensemble among `names` to the models its steps name) first, in the given order, then
    the ensembles, each after the ensembles its steps name, depth first in step order. A cycle is cut where it
    closes (its ensembles are refused when they load). Iterative: a chain of any length is ordered without
    recursion."""
    ordered: list[str] = []
    placed: set[str] = set()
    for name in [n for n in names if n not in steps] + [n for n in names if n in steps]:
        if name in placed:
            continue
        on_path = {name}
        pending: list[tuple[str, Iterator[str]]] = [(name, iter(steps.get(name, ())))]
        while pending:
            model, called = pending[-1]
            step = next((s for s in called if s in steps and s not in placed and s not in on_path), None)
            if step is None:
                pending.pop()
                on_path.discard(model)
                placed.add(model)
                ordered.append(model)
            else:
                on_path.add(step)
                pending.append((step, iter(steps[step])))
    return ordered


def _cycle_message(name: str, path: Sequence[str], cycle: Sequence[str]) -> str:
    through = _arrows(cycle)
    if len(path) == 1:
        return f"{CYCLE_REFUSAL}: ensemble '{name}' calls itself through {through}"
    return (
        f"{CYCLE_REFUSAL}: ensemble '{name}' calls ensemble '{cycle[0]}' ({_arrows(path)}), which calls itself "
        f"through {through}"
    )


_SHOWN = 12  # names of a chain shown in a message; a longer one shows its first 9 and last 2 around a count


def _arrows(names: Sequence[str]) -> str:
    if len(names) <= _SHOWN:
        return " -> ".join(names)
    left_out = len(names) - (_SHOWN - 1)
    return " -> ".join([*names[: _SHOWN - 3], f"({left_out} more)", *names[-2:]])


def _deepest_chain(name: str, called: Callable[[str], tuple[str, ...]]) -> list[str]:
    """The longest chain of ensembles from `name` (itself first) through steps that are ensembles, in a graph
    known to have no cycle. Iterative, each ensemble measured once."""
    depth: dict[str, int] = {}
    below: dict[str, str | None] = {}
    pending: list[tuple[str, bool]] = [(name, False)]
    while pending:
        model, measured = pending.pop()
        if model in depth:
            continue
        ensembles = [step for step in called(model) if called(step)]
        if not measured:
            pending.append((model, True))
            pending.extend((step, False) for step in ensembles if step not in depth)
            continue
        deepest = max(ensembles, key=depth.__getitem__, default=None)
        depth[model] = 1 + (depth[deepest] if deepest is not None else 0)
        below[model] = deepest
    chain: list[str] = []
    link: str | None = name
    while link is not None:
        chain.append(link)
        link = below[link]
    return chain


def check_against_models(
    origin: str,
    max_batch_size: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    steps: Sequence[Step],
    model_of: Callable[[Step], StepModel],
) -> bool:
    """Check the steps against their models. `model_of` gives a step's model or raises ModelConfigError naming
    why it has none (unknown, not loaded). Raises ModelConfigError naming the step, the tensor and both sides.
    Returns whether the ensemble is decoupled (a step model is: Triton's rule, see _decoupled_flow)."""
    declared: dict[str, tuple[str, tuple[int, ...], str]] = {
        t.name: (t.datatype, t.shape, "the ensemble's input") for t in inputs
    }
    models = {step.index: model_of(step) for step in steps}
    for step in steps:
        _check_step_model(origin, max_batch_size, step, models[step.index])
    # Producers first: record what each step's outputs are, then compare every consumer against them.
    for step in steps:
        model = models[step.index]
        for model_output, tensor in step.outputs.items():
            spec = _named(model.outputs, model_output)
            if spec is None:
                if model.outputs:
                    raise ModelConfigError(
                        f"{origin}: {step.label} maps output '{model_output}', which the model does not produce "
                        f"(it produces {sorted(t.name for t in model.outputs)})"
                    )
                continue
            declared[tensor] = (spec.datatype, _shape(spec, model, max_batch_size), f"{step.label} output")
    for step in steps:
        model = models[step.index]
        for model_input, tensor in step.inputs.items():
            spec = _named(model.inputs, model_input)
            if spec is None:
                if model.inputs:
                    raise ModelConfigError(
                        f"{origin}: {step.label} maps input '{model_input}', which the model does not take "
                        f"(it takes {sorted(t.name for t in model.inputs)})"
                    )
                continue
            _agree(origin, tensor, declared.get(tensor), spec.datatype, _shape(spec, model, max_batch_size), step)
    for spec in outputs:
        _agree(origin, spec.name, declared.get(spec.name), spec.datatype, spec.shape, None)
    decoupled = {step.index for step in steps if models[step.index].decoupled}
    _check_decoupled_flow(origin, [t.name for t in inputs], [t.name for t in outputs], steps, decoupled)
    return bool(decoupled)


def _check_decoupled_flow(
    origin: str, inputs: Sequence[str], outputs: Sequence[str], steps: Sequence[Step], decoupled: set[int]
) -> None:
    """Triton's rule for decoupled steps (ValidateEnsembleConfig): each response of a decoupled step runs the steps
    after it as a request of its own, so every value descends from the request itself or from one response of one
    decoupled step (its "origin": the nearest decoupled step upstream). A step, or the ensemble's outputs, reading
    values of different origins could never be given one value of each that belong together: refused in Triton's
    words ("receives inputs originated from different decoupled models"), naming each input's origin. Iterative, in
    data-flow order."""
    origin_of: dict[str, Step | None] = dict.fromkeys(inputs)  # tensor -> its origin; None: the request
    for step in _in_data_flow_order(steps, inputs):
        sources = _sources(step.inputs.values(), origin_of)
        if len(sources) > 1:
            raise ModelConfigError(
                f"{origin}: {step.label} receives inputs originated from different decoupled models "
                # by the model's input names: the input map is a protobuf map (its order is not the config's)
                f"({_origins([step.inputs[name] for name in sorted(step.inputs)], origin_of)})"
            )
        source = step if step.index in decoupled else next(iter(sources.values()))
        for tensor in step.outputs.values():
            origin_of[tensor] = source
    if len(_sources(outputs, origin_of)) > 1:
        raise ModelConfigError(
            f"{origin}, as the step collecting its outputs, receives inputs originated from different decoupled models "
            f"({_origins(outputs, origin_of)})"
        )


def _sources(tensors: Iterable[str], origin_of: Mapping[str, Step | None]) -> dict[int, Step | None]:
    """The distinct origins of `tensors`, by step index (-1: the request)."""
    found: dict[int, Step | None] = {}
    for tensor in tensors:
        source = origin_of[tensor]
        found[-1 if source is None else source.index] = source
    return found


def _origins(tensors: Iterable[str], origin_of: Mapping[str, Step | None]) -> str:
    def named(tensor: str) -> str:
        source = origin_of[tensor]
        return f"'{tensor}' from {'the request' if source is None else source.label + ' (decoupled)'}"

    return ", ".join(named(tensor) for tensor in dict.fromkeys(tensors))


def _in_data_flow_order(steps: Sequence[Step], inputs: Sequence[str]) -> list[Step]:
    """`steps` each after the steps producing its inputs (the config's order among those ready together), for a
    graph read_steps checked (every input produced, no cycle). Iterative: Kahn's algorithm."""
    readers: dict[str, list[Step]] = {}
    waiting: dict[int, int] = {}
    known = set(inputs)
    for step in steps:
        needed = {t for t in step.inputs.values() if t not in known}
        waiting[step.index] = len(needed)
        for tensor in needed:
            readers.setdefault(tensor, []).append(step)
    ready = collections.deque(step for step in steps if not waiting[step.index])
    ordered: list[Step] = []
    while ready:
        step = ready.popleft()
        ordered.append(step)
        for tensor in step.outputs.values():
            for reader in readers.get(tensor, ()):
                waiting[reader.index] -= 1
                if not waiting[reader.index]:
                    ready.append(reader)
    return ordered


def _check_step_model(origin: str, max_batch_size: int, step: Step, model: StepModel) -> None:
    if step.version != LATEST and model.version and str(step.version) != model.version:
        raise ModelConfigError(
            f"{origin}: {step.label} asks for version {step.version}; the model serves version {model.version}"
        )
    if max_batch_size > 0:  # Triton's rule: an ensemble that batches passes its batch to every step
        if model.max_batch_size == 0:
            raise ModelConfigError(
                f"{origin}: the ensemble allows maximum batch size {max_batch_size}, but {step.label} does not "
                "support batching"
            )
        if model.max_batch_size < max_batch_size:
            raise ModelConfigError(
                f"{origin}: the ensemble allows maximum batch size {max_batch_size}, but {step.label} only "
                f"allows maximum batch size {model.max_batch_size}"
            )


def _named(specs: Sequence[TensorSpec], name: str) -> TensorSpec | None:
    return next((spec for spec in specs if spec.name == name), None)


def _shape(spec: TensorSpec, model: StepModel, ensemble_batch: int) -> tuple[int, ...]:
    """A step tensor's shape as the ensemble sees it: without the batch dimension when the ensemble batches
    (both carry one), with it (variable) when only the step model batches."""
    if model.max_batch_size > 0 and ensemble_batch == 0:
        return (-1, *spec.shape)
    return spec.shape


def _agree(
    origin: str,
    tensor: str,
    produced: tuple[str, tuple[int, ...], str] | None,
    datatype: str,
    shape: tuple[int, ...],
    consumer: Step | None,
) -> None:
    """Raise when a tensor's producer and a consumer disagree on datatype or shape (-1 matches any size)."""
    if produced is None:
        return  # produced by a step whose tensors are not known before it loads
    made_type, made_shape, by = produced
    reader = f"{consumer.label} input" if consumer is not None else "the ensemble's output"
    if made_type != datatype:
        raise ModelConfigError(f"{origin}: tensor '{tensor}' is {made_type} from {by}, but {reader} expects {datatype}")
    if not _shapes_agree(made_shape, shape):
        raise ModelConfigError(
            f"{origin}: tensor '{tensor}' has shape {list(made_shape)} from {by}, but {reader} expects {list(shape)}"
        )


def _shapes_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


__all__ = [
    "CYCLE_REFUSAL",
    "LATEST",
    "MAX_NESTING",
    "Step",
    "StepModel",
    "call_graph_refusal",
    "call_graph_refusals",
    "check_against_models",
    "ensembles_after_their_steps",
    "read_steps",
    "step_models",
]
