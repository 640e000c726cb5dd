"""Tests of the TensorRT backend: API conformance against the real modules, the test double's rules, and the
backend end to end over the double."""
