"""ModelConfig and ModelMetadata never mix configurations (issue 12, item 9). A reconfiguration is forced to
commit right after the reply's first reading of the model (a hook on the entry's reading methods), which is
exactly where a reply built from several readings would pick up half of the new configuration."""

from __future__ import annotations

import threading

import pytest

from engine.testing.fixture import FixtureBackend, FixtureControls
from generated import grpc_service_pb2 as pb
from generated import grpc_service_pb2_grpc as pb_grpc
from service.core.registry import Registration
from service.testing import serve
from tests.contract.harness import write_fixture_model

WAIT = 20.0


def _reconfigure_after_first_reading(entry, registry, registration: Registration) -> list:
    """Wrap the entry's reading methods: the first reading returns what it read, but only after `registration`
    has been committed on another thread (it needs the exclusive lease, which a reply never holds)."""
    done: list = []

    def wrap(read):
        def reading(*args, **kwargs):
            value = read(*args, **kwargs)
            if not done:
                done.append(registration)
                worker = threading.Thread(target=lambda: done.append(registry.register(registration)))
                worker.start()
                worker.join(WAIT)
                assert len(done) == 2, "the reconfiguration did not complete"
            return value

        return reading

    for name in ("status", "view", "known_metadata"):
        if hasattr(entry, name):
            setattr(entry, name, wrap(getattr(entry, name)))
    return done


@pytest.fixture
def running(tmp_path):
    write_fixture_model(tmp_path, "m", {"marker": "old"})
    with serve(
        tmp_path, backends={"fixture": FixtureBackend(FixtureControls())}, parallel_jobs=1, allow_management=True
    ) as running:
        yield running


def test_model_config_never_pairs_a_new_configuration_with_the_old_slot_count(running):
    entry = running.server.registry.get("m")
    done = _reconfigure_after_first_reading(
        entry, running.server.registry, Registration(name="m", options={"marker": "new"}, slots=2)
    )
    config = running.client.model_config("m")
    assert len(done) == 2
    pair = (config.parameters["marker"].string_value, config.instance_group[0].count)
    assert pair in {("old", 1), ("new", 2)}, pair
    assert running.client.model_config("m").instance_group[0].count == 2  # the reconfiguration did happen


def test_model_metadata_never_pairs_a_new_version_with_the_old_inputs(running, tmp_path):
    source = tmp_path / "m_v2"
    write_fixture_model(source.parent, source.name)
    (source / "2").mkdir()
    (source / "config.pbtxt").write_text(
        'name: "m"\nbackend: "fixture"\nmax_batch_size: 0\n'
        'input { name: "INPUT_B" data_type: TYPE_FP32 dims: -1 }\n'
        'output { name: "OUTPUT_B" data_type: TYPE_FP32 dims: -1 }\n'
    )
    entry = running.server.registry.get("m")
    done = _reconfigure_after_first_reading(entry, running.server.registry, Registration(name="m", source=str(source)))
    stub = pb_grpc.GRPCInferenceServiceStub(running.client.channel)
    metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="m"), timeout=WAIT)
    assert len(done) == 2
    pair = (tuple(metadata.versions), tuple(tensor.name for tensor in metadata.inputs))
    assert pair in {(("1",), ("INPUT0",)), (("2",), ("INPUT_B",))}, pair
