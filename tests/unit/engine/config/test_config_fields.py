"""config.pbtxt as Triton writes it: every field of ModelConfig parses (list syntax included), and each set field is
applied, refused by name with its path, or ignored with one warning naming them all (engine/config/fields.py FIELDS).
Warmup samples and the version policy are read into the ModelSpec and checked there."""

from __future__ import annotations

import importlib.util
import json
import logging
import struct
import subprocess
import sys
import textwrap

import pytest

from engine.config.fields import FIELDS, Treatment, classify_fields, rule_for
from engine.config.repository import ModelRepository, parse_config_text
from engine.config.specs import VersionPolicy, WarmupInput, WarmupSample
from engine.errors import ModelConfigError
from generated import model_config_pb2

HEAD = 'name: "m"\nbackend: "fixture"\nmax_batch_size: 8\n'
TENSORS = textwrap.dedent(
    """
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "S" data_type: TYPE_STRING dims: [ 2 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """
)


def write_model(root, text: str, name: str = "m", versions=(1,)):
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(text)
    for version in versions:
        (directory / str(version)).mkdir(exist_ok=True)
    return directory


def read(root, text: str, **kwargs):
    write_model(root, text, **kwargs)
    return ModelRepository(root).read(kwargs.get("name", "m"))


def refusal(root, text: str, **kwargs) -> str:
    with pytest.raises(ModelConfigError) as refused:
        read(root, text, **kwargs)
    return str(refused.value)


# ---- the table covers the whole message ----------------------------------------------------------------------


def _paths(descriptor, prefix: str = ""):
    for field in descriptor.fields:
        path = f"{prefix}{field.name}"
        yield path
        nested = field.message_type
        if nested is not None and not nested.GetOptions().map_entry:
            yield from _paths(nested, f"{path}.")


def test_every_field_of_model_config_has_a_rule_and_every_rule_names_a_field():
    paths = set(_paths(model_config_pb2.ModelConfig.DESCRIPTOR))
    assert not [p for p in paths if rule_for(p) is None], "fields the table does not judge"
    assert not [key for key in FIELDS if key not in paths], "table entries naming no field"
    # The proto is Triton's whole message: a few deep fields stand for it.
    for path in (
        "optimization.cuda.graph_spec.graph_lower_bound.input",
        "sequence_batching.state.initial_state.data_file",
        "instance_group.rate_limiter.resources.global",
        "ensemble_scheduling.step.model_namespace",
        "model_repository_agents.agents.parameters",
    ):
        assert path in paths, path


_FIELD_NUMBERS = """
import json, sys, importlib
module = importlib.import_module(sys.argv[1])
def walk(descriptor, prefix, out):
    for field in descriptor.fields:
        path = prefix + field.name
        out[path] = [field.number, field.type, field.is_repeated]
        nested = field.message_type
        if nested is not None and not nested.GetOptions().map_entry:
            walk(nested, path + ".", out)
    return out
print(json.dumps(walk(module.ModelConfig.DESCRIPTOR, "", {})))
"""


def _field_numbers(module: str) -> dict:
    # A process each: both modules register "model_config.proto" in protobuf's default pool.
    done = subprocess.run(
        [sys.executable, "-c", _FIELD_NUMBERS, module], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout)


def test_every_field_has_tritons_number_and_type_as_tritonclient_ships_them():
    if importlib.util.find_spec("tritonclient") is None:  # not imported here: see _field_numbers
        pytest.skip("tritonclient is not installed (requirements-dev.txt has it)")
    ours, theirs = _field_numbers("generated.model_config_pb2"), _field_numbers("tritonclient.grpc.model_config_pb2")
    assert {path: theirs.get(path) for path in ours} == ours
    # tritonclient is newer than 2.51: what it has beyond our message came later (per-model metrics, the
    # ensemble's in-flight bound).
    later = {p for p in theirs if p not in ours}
    assert all(p.startswith("model_metrics") or p == "ensemble_scheduling.max_inflight_requests" for p in later), later


# ---- list syntax and Triton's own shapes parse -----------------------------------------------------------------

LIST_SYNTAX = {
    "model_warmup": """model_warmup [ { name: "zeros" batch_size: 2 count: 3
        inputs [ { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } },
                 { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } } ] } ]""",
    "batch_input": """batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: [ "N" ] data_type: TYPE_FP32
        source_input: [ "X" ] } ]""",
    "instance_group": """instance_group [ { count: 2 kind: KIND_CPU passive: true
        rate_limiter { resources [ { name: "R1" count: 4 }, { name: "R2" global: true count: 2 } ] priority: 2 } } ]""",
    "ensemble_scheduling": """ensemble_scheduling { step [
        { model_name: "a" model_version: -1
          input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "t" } },
        { model_name: "b" model_version: -1
          input_map { key: "IN" value: "t" } output_map { key: "OUT" value: "Y" } } ] }""",
    "sequence_batching": """sequence_batching { control_input [
        { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }""",
}


@pytest.mark.parametrize("block", sorted(LIST_SYNTAX))
def test_list_syntax_parses_with_the_whole_message(block):
    config = parse_config_text(HEAD + TENSORS + LIST_SYNTAX[block], "model 'm'")
    assert config.HasField(block) if block in ("ensemble_scheduling", "sequence_batching") else getattr(config, block)


def test_the_refusal_names_every_refused_field_with_its_path(tmp_path):
    text = HEAD + TENSORS + "\n".join(LIST_SYNTAX[b] for b in ("batch_input", "instance_group"))
    text += '\nmodel_repository_agents { agents [ { name: "checksum" } ] }'
    message = refusal(tmp_path, text + '\nmodel_operations { op_library_filename: [ "libop.so" ] }')
    assert "instance_group[0].passive: not supported" in message
    assert "rate_limiter" not in message  # applied (the rate limiter, docs/lifecycle.md)
    assert "model_repository_agents: not supported" in message
    assert "batch_input: not supported" in message
    assert "model_operations: not supported" in message


def test_an_ensemble_is_read_with_its_steps_applied(tmp_path):
    text = 'name: "m"\nplatform: "ensemble"\nmax_batch_size: 8\n' + TENSORS + LIST_SYNTAX["ensemble_scheduling"]
    spec = read(tmp_path, text)
    assert spec.backend == "ensemble" and spec.platform == "ensemble" and spec.model_file is None
    assert [step.model_name for step in spec.config.ensemble_scheduling.step] == ["a", "b"]


def test_the_python_backend_is_read_with_its_model_py(tmp_path):
    directory = write_model(tmp_path, 'name: "m"\nbackend: "python"\n' + TENSORS)
    (directory / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    spec = ModelRepository(tmp_path).read("m")
    assert spec.backend == "python" and spec.model_file == (directory / "1" / "model.py").resolve()


# Shaped like Triton's simple_sequence and simple_dyna_sequence examples (control inputs in list syntax, the
# oldest strategy, parameters as a list).
SEQUENCE_SHAPES = {
    "direct": """name: "m"
        platform: "onnxruntime_onnx"
        max_batch_size: 4
        sequence_batching {
          control_input [
            { name: "BEGIN" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "LIVE" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
          ]
        }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU } ]""",
    "oldest": """name: "m"
        backend: "onnxruntime"
        max_batch_size: 4
        sequence_batching {
          max_sequence_idle_microseconds: 5000000
          oldest { max_candidate_sequences: 64 max_queue_delay_microseconds: 500 }
          control_input [
            { name: "BEGIN" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "FINISH" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
            { name: "ID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
          ]
          state [ { input_name: "PAST" output_name: "NEXT" data_type: TYPE_FP32 dims: [ 2 ]
                    initial_state [ { name: "zeros" data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } ] } ]
        }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        parameters [ { key: "delay_ms" value: { string_value: "3" } } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]""",
}


@pytest.mark.parametrize("shape", sorted(SEQUENCE_SHAPES))
def test_sequence_configs_shaped_like_tritons_examples_are_read(tmp_path, shape):
    config = parse_config_text(textwrap.dedent(SEQUENCE_SHAPES[shape]), "model 'm'")
    assert len(config.sequence_batching.control_input) >= 2
    directory = write_model(tmp_path, textwrap.dedent(SEQUENCE_SHAPES[shape]))
    (directory / "1" / "model.onnx").write_bytes(b"")  # read, not loaded
    spec = ModelRepository(tmp_path).read("m")
    sequence = spec.sequence
    assert sequence is not None
    if shape == "oldest":  # 64 candidates; their requests batch with oldest's delay
        assert (sequence.strategy, sequence.max_candidates, sequence.max_idle_us) == ("oldest", 64, 5_000_000)
        assert spec.batching is not None and spec.batching.max_queue_delay_us == 500
        assert [(s.input_name, s.output_name, s.dims) for s in sequence.states] == [("PAST", "NEXT", (2,))]
        assert [c.kind for c in sequence.controls] == ["start", "end", "corrid"]
        return
    assert sequence.strategy == "direct" and sequence.max_idle_us == 1_000_000 and spec.batching is None
    assert [(c.kind, c.input_name, c.datatype) for c in sequence.controls] == [
        ("start", "BEGIN", "INT32"),
        ("ready", "LIVE", "INT32"),
    ]


def test_a_field_triton_does_not_have_is_a_syntax_error_naming_it(tmp_path):
    message = refusal(tmp_path, HEAD + "no_such_field: 3\n")
    assert "no_such_field" in message and "config.pbtxt" in message


# ---- ignored fields: one warning names them all ----------------------------------------------------------------


def test_one_warning_names_every_ignored_field_and_the_model_loads(tmp_path, caplog):
    text = HEAD + textwrap.dedent(
        """
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] format: FORMAT_NCHW reshape { shape: [ 2, 2 ] } } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
        instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] }, { count: 3 kind: KIND_CPU } ]
        optimization { cuda { graphs: true } input_pinned_memory { enable: true } }
        metric_tags { key: "team" value: "a" }
        response_cache { enable: true }
        """
    )
    with caplog.at_level(logging.WARNING, logger="engine.config.repository"):
        spec = read(tmp_path, text)
    warnings = [r.getMessage() for r in caplog.records if "settings ignored" in r.getMessage()]
    assert len(warnings) == 1, warnings
    for path in (
        "input[0].format",
        "input[0].reshape",
        "output[0].label_filename",
        "instance_group[0].kind",
        "instance_group[0].gpus",
        "instance_group[1].count",
        "instance_group[1].kind",
        "optimization",
        "metric_tags",
    ):
        assert f"{path} ignored" in warnings[0], path
    assert "response_cache" not in warnings[0]  # applied: the response cache (service/request_path/response_cache.py)
    assert spec.instance_count == 2 and spec.response_cache is True


def test_applied_fields_raise_no_warning(tmp_path, caplog):
    text = HEAD + TENSORS + "dynamic_batching { preferred_batch_size: [ 4 ] }\ninstance_group [ { count: 2 } ]\n"
    with caplog.at_level(logging.WARNING, logger="engine.config.repository"):
        spec = read(tmp_path, text)
    assert "settings ignored" not in caplog.text
    assert spec.batching is not None and spec.instance_count == 2


def test_the_table_judges_a_set_field_by_its_rule():
    config = parse_config_text(HEAD + TENSORS + LIST_SYNTAX["instance_group"], "m")
    judged = classify_fields(config)
    assert [p for p, _ in judged.refused] == ["instance_group[0].passive"]
    assert [p for p, _ in judged.ignored] == ["instance_group[0].kind"]
    assert FIELDS["instance_group.rate_limiter"].treatment is Treatment.APPLIED


# ---- versions -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, versions, expected",
    [
        ("", (1, 2), VersionPolicy()),
        ("version_policy { latest { num_versions: 1 } }", (1, 3), VersionPolicy("latest", 1)),
        ("version_policy { specific { versions: [ 3 ] } }", (1, 3), VersionPolicy("specific", 1, (3,))),
        ("version_policy { all { } }", (2,), VersionPolicy("all")),
    ],
)
def test_a_policy_that_selects_the_highest_version_is_read_into_the_spec(tmp_path, policy, versions, expected):
    spec = read(tmp_path, HEAD + TENSORS + policy, versions=versions)
    assert spec.version_policy == expected
    assert spec.version == str(max(versions))


@pytest.mark.parametrize(
    "policy, folders, served",
    [
        ("", (1, 2, 3), ("3",)),
        ("version_policy { latest { num_versions: 2 } }", (1, 2, 3), ("3", "2")),
        ("version_policy { all { } }", (1, 2, 3), ("3", "2", "1")),
        ("version_policy { specific { versions: [ 1, 3, 9 ] } }", (1, 2, 3), ("3", "1")),
        ("version_policy { specific { versions: [ 1 ] } }", (1, 2, 3), ("1",)),
    ],
)
def test_every_version_the_policy_selects_is_read_as_its_own_spec(tmp_path, policy, folders, served):
    write_model(tmp_path, HEAD + TENSORS + policy, versions=folders)
    specs = ModelRepository(tmp_path).read_versions("m")
    assert tuple(spec.version for spec in specs) == served
    assert ModelRepository(tmp_path).read("m").version == served[0]  # read: the highest served version


def test_each_versions_spec_names_its_own_folders_model_file(tmp_path):
    directory = write_model(
        tmp_path, 'name: "m"\nplatform: "onnxruntime_onnx"\nversion_policy { all { } }\n', versions=(1, 2)
    )
    for version in (1, 2):
        (directory / str(version) / "model.onnx").write_bytes(b"x")
    specs = ModelRepository(tmp_path).read_versions("m")
    assert [(s.version, s.model_file) for s in specs] == [
        ("2", (directory / "2" / "model.onnx").resolve()),
        ("1", (directory / "1" / "model.onnx").resolve()),
    ]


def test_a_policy_that_selects_no_version_folder_is_refused_by_name(tmp_path):
    message = refusal(tmp_path, HEAD + TENSORS + "version_policy { specific { versions: [ 7 ] } }", versions=(1, 2))
    assert "version_policy" in message and "selects none of the version folders [1, 2]" in message


def test_the_version_policy_selects_as_triton_defines_it():
    assert VersionPolicy().select([1, 3, 2]) == (3,)
    assert VersionPolicy("latest", 2).select([1, 3, 2]) == (3, 2)
    assert VersionPolicy("all").select([1, 3]) == (3, 1)
    assert VersionPolicy("specific", versions=(1, 9)).select([1, 3]) == (1,)


# ---- warmup ---------------------------------------------------------------------------------------------------


def test_warmup_samples_are_read_into_the_spec(tmp_path):
    directory = write_model(tmp_path, HEAD + TENSORS)
    (directory / "warmup").mkdir()
    (directory / "warmup" / "strings").write_bytes(struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0))
    (directory / "config.pbtxt").write_text(
        HEAD
        + TENSORS
        + """model_warmup [ { name: "w" batch_size: 4 count: 2 inputs [
            { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } },
            { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "strings" } } ] },
            { name: "once" batch_size: 1 inputs [
            { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } },
            { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } } ] } ]"""
    )
    spec = ModelRepository(tmp_path).read("m")
    strings = (directory / "warmup" / "strings").resolve()
    assert spec.warmup == (
        WarmupSample(
            "w",
            4,
            2,
            (WarmupInput("S", "BYTES", (2,), "file", strings), WarmupInput("X", "FP32", (4,), "random")),
        ),
        WarmupSample("once", 1, 1, (WarmupInput("S", "BYTES", (2,), "zero"), WarmupInput("X", "FP32", (4,), "zero"))),
    )


def _warmup(inputs: str, batch_size: int = 1) -> str:
    return HEAD + TENSORS + f'model_warmup [ {{ name: "w" batch_size: {batch_size} inputs [ {inputs} ] }} ]'


X_ZERO = '{ key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }'
S_ZERO = '{ key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }'


@pytest.mark.parametrize(
    "text, words",
    [
        (_warmup(f"{X_ZERO}, {S_ZERO}", batch_size=9), "batch_size must be 1..8"),
        (_warmup(f"{X_ZERO}, {S_ZERO}", batch_size=0), "batch_size must be 1..8"),
        (_warmup(X_ZERO), "no data for the model's inputs ['S']"),
        (_warmup(S_ZERO + ', { key: "Z" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }'), "'Z'"),
        (_warmup(S_ZERO + ', { key: "X" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } }'), "TYPE_INT32"),
        (_warmup(S_ZERO + ', { key: "X" value: { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } }'), "[5]"),
        (_warmup(S_ZERO + ', { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] } }'), "set one of zero_data"),
        (
            _warmup(S_ZERO + ', { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x" } }'),
            "not found",
        ),
        (
            _warmup(S_ZERO + ', { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "../1/f" } }'),
            "must be inside warmup/",
        ),
    ],
)
def test_a_warmup_sample_that_cannot_run_is_refused_naming_the_sample_and_input(tmp_path, text, words):
    directory = write_model(tmp_path, text)
    (directory / "warmup").mkdir()
    (directory / "1" / "f").write_bytes(bytes(16))
    message = refusal(tmp_path, text)
    assert "model_warmup[0] 'w'" in message and words in message, message


def test_a_warmup_file_of_the_wrong_size_is_refused_with_the_numbers(tmp_path):
    text = _warmup(S_ZERO + ', { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.bin" } }')
    directory = write_model(tmp_path, text)
    (directory / "warmup").mkdir()
    (directory / "warmup" / "x.bin").write_bytes(bytes(15))
    message = refusal(tmp_path, text)
    assert "has 15 bytes; [4] FP32 takes 16" in message and "input 'X'" in message
