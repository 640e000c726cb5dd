"""engine/config/sequence_batching.py through the repository reader: `iterative_sequence`, and `oldest` without a batch
dimension or without max_candidate_sequences, read as Triton 2.51 takes them (issue 34 items 5 and 6); the
settings that cannot work refused naming the field."""

from __future__ import annotations

import pytest

from engine.config.repository import ModelRepository
from engine.errors import ModelConfigError

TENSORS = (
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
)


def read(root, head: str, block: str):
    directory = root / "m"
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (directory / "config.pbtxt").write_text(
        f'name: "m"\nbackend: "python"\n{head}\n{TENSORS}sequence_batching {{ {block} }}\n'
    )
    return ModelRepository(root).read("m")


def test_iterative_sequence_is_read_with_either_strategy(tmp_path):
    spec = read(tmp_path, "max_batch_size: 0", "iterative_sequence: true")
    assert spec.sequence is not None and spec.sequence.iterative and spec.sequence.strategy == "direct"
    oldest = read(tmp_path / "o", "max_batch_size: 4", "iterative_sequence: true oldest { max_candidate_sequences: 3 }")
    assert oldest.sequence is not None and oldest.sequence.iterative and oldest.sequence.max_candidates == 3
    assert oldest.batching is not None  # its requests batch, as any oldest model's


def test_a_decoupled_direct_sequence_model_loads(tmp_path):
    spec = read(tmp_path, "model_transaction_policy { decoupled: true }", "iterative_sequence: true")
    assert spec.sequence is not None and spec.sequence.iterative


def test_oldest_without_a_batch_dimension_loads_and_runs_each_request_alone(tmp_path):
    spec = read(tmp_path, "max_batch_size: 0", "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 9 }")
    assert spec.sequence is not None and (spec.sequence.strategy, spec.sequence.max_candidates) == ("oldest", 4)
    assert spec.batching is None  # nothing to batch along: no delay, no batch
    decoupled = read(tmp_path / "d", "model_transaction_policy { decoupled: true }", "oldest { }")
    assert decoupled.sequence is not None and decoupled.sequence.max_candidates == 1


def test_oldest_without_max_candidate_sequences_has_tritons_default(tmp_path):
    # Triton's sequence batcher: max(1, max_batch_size) slots unless max_candidate_sequences > 0.
    spec = read(tmp_path, "max_batch_size: 4", "oldest { }")
    assert spec.sequence is not None and spec.sequence.max_candidates == 4


@pytest.mark.parametrize(
    "head, block, field",
    [
        ("max_batch_size: 2\nmodel_transaction_policy { decoupled: true }", "oldest { }", "sequence_batching.oldest"),
        (
            "model_transaction_policy { decoupled: true }",
            'state [ { input_name: "SI" output_name: "SO" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "sequence_batching.state",
        ),
        ("max_batch_size: 2", "oldest { max_candidate_sequences: -2 }", "max_candidate_sequences must not be negative"),
    ],
)
def test_what_cannot_work_is_refused_naming_the_field(tmp_path, head, block, field):
    with pytest.raises(ModelConfigError, match=field):
        read(tmp_path, head, block)
