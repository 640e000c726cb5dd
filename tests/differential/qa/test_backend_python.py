"""L0_backend_python's top level (python_test.py and the single-model checks of its test.sh), rewritten: datatypes
through a python model (BOOL, BF16 by DLPack, strings, non-contiguous outputs, optional inputs), the initialize
arguments, a 2 MiB payload, four requests batched into one execute, `default_model_filename`, a model of several
files, the environment a model sees, and a model whose process dies while it initializes."""

# ruff: noqa: E501  (the config.pbtxt and model.py texts embedded here keep their one-line entries)

from __future__ import annotations

import concurrent.futures
import re

import numpy as np
import pytest

from .harness import Model, python_model, tensor

IDENTITY = """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
                )
                for r in requests
            ]
"""


def identity_config(datatype: str, max_batch_size: int = 64, extra: str = "") -> str:
    return f"""
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT0" data_type: {datatype} dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ -1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        {extra}
    """


BF16_IDENTITY = """
    import json

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                given = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                copy = pb_utils.Tensor.from_dlpack("OUTPUT0", given.to_dlpack())
                try:
                    given.as_numpy()
                    as_numpy = "converted"
                except pb_utils.TritonModelException as error:
                    as_numpy = str(error)
                responses.append(pb_utils.InferenceResponse([copy]))
                self.seen = as_numpy
            return responses
"""

INIT_ARGS = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.args = dict(args)

        def execute(self, requests):
            shown = {key: value for key, value in self.args.items() if key != "model_config"}
            shown["keys"] = sorted(self.args)
            text = json.dumps(shown)
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text], dtype=np.object_))])
                for _ in requests
            ]
"""

OPTIONAL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                values = []
                for name in ("INPUT0", "INPUT1"):
                    given = pb_utils.get_input_tensor_by_name(request, name)
                    values.append(given.as_numpy() if given is not None else np.array([5], dtype=np.int32))
                outputs = [pb_utils.Tensor("OUTPUT0", values[0] + values[1]), pb_utils.Tensor("OUTPUT1", values[0] - values[1])]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""

# The n-th request is answered as bytes_ (even n) or object (odd n), as the QA's unicode model alternates.
STRING_ECHO = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.calls = 0

        def execute(self, requests):
            responses = []
            for request in requests:
                kind = (np.bytes_, np.object_)[self.calls % 2]
                self.calls += 1
                given = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", given.astype(kind))]))
            return responses
"""

# Whatever it is sent: "123456" as bytes_, then an empty object array, and again (the QA's string_fixed).
STRING_FIXED = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.calls = 0

        def execute(self, requests):
            responses = []
            for _ in requests:
                if self.calls % 2 == 0:
                    value = np.array(["123456"], dtype=np.bytes_)
                else:
                    value = np.array([], dtype=np.object_)
                self.calls += 1
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
            return responses
"""

NON_CONTIGUOUS = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                outputs = [
                    pb_utils.Tensor("OUTPUT0", value.reshape([10, 2, 6, 5, 11])),
                    pb_utils.Tensor("OUTPUT1", value.T),
                    pb_utils.Tensor("OUTPUT2", np.transpose(value, [1, 0, 4, 2, 3])),
                ]
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
"""

# Several files: `import helper_one` (the version folder on sys.path) and `from . import helper_two` (model.py a
# module of the version folder's package), as the QA's multi_file model does.
MULTI_FILE = """
    import helper_one
    import numpy as np
    import triton_python_backend_utils as pb_utils

    from . import helper_two


    class TritonPythonModel:
        def initialize(self, args):
            if helper_one.NAME != "ONE" or helper_two.NAME != "TWO":
                raise pb_utils.TritonModelException("the helper files were not imported")

        def execute(self, requests):
            text = f"{helper_one.NAME}{helper_two.NAME} {__name__}"
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([text], dtype=np.object_))])
                for _ in requests
            ]
"""

ENVIRONMENT_MODEL = """
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            if os.environ.get("QA_MY_ENV") != "QA_MY_ENV":
                raise pb_utils.TritonModelException("QA_MY_ENV is missing or wrong")

        def execute(self, requests):
            text = os.environ["QA_MY_ENV"]
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([text], dtype=np.object_))])
                for _ in requests
            ]
"""

STRING_OUT = """
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

ENVIRONMENT = {"QA_MY_ENV": "QA_MY_ENV"}
BATCH_DELAY_US = 12_000_000  # the QA's: long enough that only a full preferred batch runs early


def MODELS() -> dict[str, Model]:
    models = {
        "identity_fp32": python_model(identity_config("TYPE_FP32"), IDENTITY),
        "identity_bool": python_model(identity_config("TYPE_BOOL"), IDENTITY),
        "identity_uint32": python_model(identity_config("TYPE_UINT32"), IDENTITY),
        "identity_uint8_nobatch": python_model(identity_config("TYPE_UINT8", 0), IDENTITY),
        "identity_uint8": python_model(
            identity_config(
                "TYPE_UINT8",
                8,
                f"dynamic_batching {{ preferred_batch_size: [8] max_queue_delay_microseconds: {BATCH_DELAY_US} }}",
            ),
            IDENTITY,
        ),
        "identity_bf16": python_model(identity_config("TYPE_BF16"), BF16_IDENTITY),
        "init_args": python_model(
            """
            max_batch_size: 64
            input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
            output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
            instance_group [ { count: 1 kind: KIND_CPU } ]
            """,
            INIT_ARGS,
        ),
        "optional": python_model(
            """
            max_batch_size: 0
            input [
              { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
              { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
            ]
            output [
              { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] },
              { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 1 ] }
            ]
            """,
            OPTIONAL,
        ),
        "string": python_model(
            """
            max_batch_size: 0
            input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
            output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
            """,
            STRING_ECHO,
        ),
        "string_fixed": python_model(
            """
            max_batch_size: 0
            input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
            output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
            """,
            STRING_FIXED,
        ),
        "non_contiguous": python_model(
            """
            input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1, -1, -1, -1 ] } ]
            output [
              { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1, -1, -1, -1 ] },
              { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1, -1, -1, -1, -1 ] },
              { name: "OUTPUT2" data_type: TYPE_FP32 dims: [ -1, -1, -1, -1, -1 ] }
            ]
            """,
            NON_CONTIGUOUS,
        ),
        "multi_file": python_model(
            STRING_OUT,
            MULTI_FILE,
            extra={"helper_one.py": 'NAME = "ONE"\n', "helper_two.py": 'NAME = "TWO"\n'},
        ),
        "model_env": python_model(STRING_OUT, ENVIRONMENT_MODEL),
    }
    renamed = python_model(identity_config("TYPE_FP32") + 'default_model_filename: "mymodel.py"', IDENTITY)
    models["default_model_name"] = Model(renamed.config, {"1/mymodel.py": renamed.files["1/model.py"]})
    return models


def _identity(server, model: str, data: np.ndarray, datatype: str | None = None) -> None:
    answer = server.infer(model, {"INPUT0": tensor(data, datatype)})
    assert answer.ok, answer
    assert np.array_equal(answer["OUTPUT0"], data)


def test_bool(server):
    _identity(server, "identity_bool", np.array([[True, False, True]]))


def test_uint32_and_fp32(server):
    _identity(server, "identity_uint32", np.array([[1, 2**32 - 1]], dtype=np.uint32))
    _identity(server, "identity_fp32", np.random.randn(1, 16).astype(np.float32))


@pytest.mark.parametrize("megabytes", [2, 16])
def test_large_payload(server, megabytes):
    """python_test.py test_growth_error's successful sizes: a payload far over the first shared-memory size."""
    _identity(server, "identity_uint8_nobatch", np.random.randint(0, 255, size=[megabytes << 20], dtype=np.uint8))


def test_bf16(server):
    """A BF16 tensor goes through Tensor.to_dlpack and Tensor.from_dlpack unchanged, and comes back BF16."""
    values = np.array([[1.0, -2.5], [0.15625, 3.0]], dtype=np.float32)
    answer = server.infer("identity_bf16", {"INPUT0": tensor(values, "BF16")})
    assert answer.ok, answer
    assert answer.reply.outputs[0].datatype == "BF16"
    np.testing.assert_allclose(answer["OUTPUT0"], values)


def test_init_args(server):
    """initialize gets the seven keys, with the instance's name, kind, device, version and model folder."""
    answer = server.infer("init_args", {"IN": np.zeros([1, 2], np.float32)})
    shown = __import__("json").loads(answer["OUT"].reshape(-1)[0])
    assert shown["keys"] == sorted(
        [
            "model_config",
            "model_instance_kind",
            "model_instance_name",
            "model_instance_device_id",
            "model_repository",
            "model_version",
            "model_name",
        ]
    )
    assert shown["model_name"] == "init_args"
    assert shown["model_instance_name"] == "init_args_0_0"
    assert (shown["model_instance_kind"], shown["model_instance_device_id"]) == ("CPU", "0")
    assert shown["model_version"] == "1"
    assert shown["model_repository"] == str(server.repository / "init_args")


def test_unicode(server):
    """A UTF-8 string comes back the same whether the model answers with numpy bytes_ or object."""
    text = "😀".encode()
    for _ in range(2):
        answer = server.infer("string", {"INPUT0": np.array([text], dtype=np.object_)})
        assert answer["OUTPUT0"].tolist() == [text]


def test_optional_input(server):
    for given in ({}, {"INPUT0"}, {"INPUT1"}, {"INPUT0", "INPUT1"}):
        values = {name: np.array([7 if name == "INPUT0" else 3], np.int32) for name in given}
        answer = server.infer("optional", values)
        first = values.get("INPUT0", np.array([5], np.int32))
        second = values.get("INPUT1", np.array([5], np.int32))
        assert answer["OUTPUT0"].tolist() == (first + second).tolist(), given
        assert answer["OUTPUT1"].tolist() == (first - second).tolist(), given


def test_string_outputs(server):
    """bytes_ and empty object outputs, alternately."""
    for index in range(4):
        output = server.infer("string_fixed", {"INPUT0": np.array(["123456"], dtype=np.object_)})["OUTPUT0"]
        if index % 2 == 0:
            assert output.tolist() == [b"123456"]
        else:
            assert output.size == 0


def test_non_contiguous(server):
    value = np.random.rand(2, 10, 11, 6, 5).astype(np.float32)
    answer = server.infer("non_contiguous", {"INPUT0": value})
    assert np.array_equal(answer["OUTPUT0"], value.reshape([10, 2, 6, 5, 11]))
    assert np.array_equal(answer["OUTPUT1"], value.T)
    assert np.array_equal(answer["OUTPUT2"], np.transpose(value, [1, 0, 4, 2, 3]))


def test_async_infer_is_one_batch(server):
    """Four requests of two rows each, sent together to a model with preferred_batch_size 8 and a 12 s delay:
    one execute of 8 rows (statistics and metrics)."""
    data = [np.random.randint(0, 255, size=[2, 2], dtype=np.uint8) for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda value: server.infer("identity_uint8", {"INPUT0": value}), data))
    for value, answer in zip(data, answers, strict=True):
        assert np.array_equal(answer["OUTPUT0"], value)
    stats = server.statistics("identity_uint8")
    assert (stats.inference_count, stats.execution_count) == (8, 1)
    assert [entry.batch_size for entry in stats.batch_stats] == [8]
    metrics = server.metrics()
    for name, value in (("nv_inference_request_success", 4), ("nv_inference_count", 8), ("nv_inference_exec_count", 1)):
        found = re.search(rf'^{name}\{{model="identity_uint8",version="1"\}} (\S+)$', metrics, re.MULTILINE)
        assert found and float(found.group(1)) == value, (name, found and found.group(0))


def test_default_model_filename(server):
    _identity(server, "default_model_name", np.ones([1, 4], np.float32))


def test_multi_file_model(server):
    answer = server.infer("multi_file", {"INPUT0": np.zeros([1], np.float32)})
    assert answer["OUTPUT0"].tolist() == [b"ONETWO 1.model"]


def test_model_sees_the_server_environment(server):
    assert server.infer("model_env", {"INPUT0": np.zeros([1], np.float32)})["OUTPUT0"].tolist() == [b"QA_MY_ENV"]


KILLED_IN_INITIALIZE = """
    import os
    import signal


    class TritonPythonModel:
        def initialize(self, args):
            os.kill(os.getpid(), signal.SIGKILL)

        def execute(self, requests):
            pass
"""


def test_a_model_killed_in_initialize_fails_its_load(launch):
    """test.sh's init_exit: the process dies in initialize (as the OOM killer would): the load fails, naming it."""
    models = {"init_exit": python_model(identity_config("TYPE_FP32"), KILLED_IN_INITIALIZE)}
    server = launch(models, ("--model-control-mode=explicit",), model_control_mode="explicit")
    code, message = server.load("init_exit")
    assert code != "OK"
    assert "init_exit" in message
    assert not server.ready("init_exit")
