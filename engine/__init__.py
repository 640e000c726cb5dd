"""Engines: the config reader (engine/config/), the backend interface (interface.py), and the ONNX Runtime,
TensorRT, python and fixture backends.

Floors, each importing only those below it: the shared vocabulary (datatypes.py, errors.py, tensor_codec.py); the
config reader (config/: a repository read into specs); the backend interface (interface.py); the backends
(onnxruntime_backend.py, tensorrt/, python/, testing/). tests/unit/test_engine_layers.py holds them to it, and to
no import circle.

Nothing in this package imports gRPC. Import backends from their modules; this package imports none of them
eagerly, so the client library can use `engine.tensor_codec` without loading ONNX Runtime.
"""
