"""Engines: the backend interface, the model repository, and the ONNX Runtime, TensorRT and fixture backends.

Nothing in this package imports gRPC. Import backends from their modules; this package imports none of them
eagerly, so the client library can use `engine.tensor_codec` without loading ONNX Runtime.
"""
