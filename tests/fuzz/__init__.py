"""Fuzz tests. Hostile input: thousands of generated ModelInfer requests, valid and corrupt, against a real server.

A real in-process server (service.testing.serve, port 0, the parallel runtime with one slot and a queue of one per
model) serves the demo models `simple`, `simple_identity` and `identity_fp32`, plus `gated`, a fixture model
(output = input) whose execute gate the concurrent test holds to make requests queue and be refused, with system
shared memory on and a few regions registered (lab.REGIONS). Hypothesis
builds requests as a valid request for one of them (raw or typed contents, any batch and width, messages small
and over 64 KiB, requested outputs, parameters) followed by zero or more mutations: unknown or odd model names
and versions, input names, datatypes (every KServe datatype with contents that fit it, and invalid strings),
shapes (negative, zero, huge, wrong rank), raw contents (wrong lengths, random bytes, truncated BYTES prefixes,
wrong entry counts), typed contents of every kind (wrong kind, wrong count, out of range, raw and typed together),
parameters (`timeout` of every InferParameter kind and value, unknown keys of every kind), requested outputs
(unknown, duplicated, with parameters), tensor parameters, and tensors put in shared-memory regions with
parameters of every kind and value (registered and unknown regions, offsets and sizes exact or at the edges, contents
kept or dropped). The requests go through the raw generated
stub, since the client library refuses to build most of them.

What every test asserts:
* every call ends, each with a per-call bound (a call that does not end is reported as a hang), with a status in
  {OK, INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE}: never INTERNAL or UNKNOWN;
* an unknown model is NOT_FOUND; an unmutated valid request succeeds (where nothing else competes for slots);
* an OK response is well-formed (one raw_output_contents entry per output, the outputs asked for, lengths that
  fit the shape and datatype, id and model echoed) and correct: the outputs are recomputed from the request's
  own bytes with numpy, independently of the server's codec;
* afterwards the server answers a valid request correctly, no model has a leased slot or a queued request, and
  its statistics count every OK response as exactly one success (and each refusal of a known model at most once).

The fuzzer's findings are kept as explicit tests: status messages that echo long request strings
(test_long_strings.py, fixed in service/transport/status_codes.py), large messages with a group field
(test_undecodable_bytes.py, test_a_large_message_with_a_group_field_is_read_as_protobuf_reads_it, fixed in
service/transport/wire.py) and zero-element shapes too large for numpy (test_absurd_shapes.py, fixed in
service/transport/tensors.py).

Undecodable bytes (random bytes, corrupted serialized requests, unknown fields of every wire type) are sent
through a generic method with identity serializers: bytes that protobuf decodes must be treated like any request
(allowed statuses only); bytes protobuf cannot decode may get gRPC's own INTERNAL "Exception deserializing
request!" (the deserializer runs in grpc before any handler; see test_undecodable_bytes) and the server must
keep serving. Oversize messages are refused by the configured --max-message-bytes with RESOURCE_EXHAUSTED, and
the next small request succeeds.

Hostile management calls: test_management_fuzz.py sends RepositoryModelLoad and Unload with generated names (`..`,
`/`, newlines, ANSI escapes, NUL, 300 characters), config JSON and `file:` paths; a name that is not a model name is
INVALID_ARGUMENT before anything touches the disk, nothing is written outside --model-files-dir or into the
repository, and the server serves on.

Hostile repositories: test_ensemble_cycles_fuzz.py generates call graphs of ensembles (self, mutual, long and
nested cycles, shared steps) and checks the load decision against an independent oracle, then serves whole
repositories of them on servers of its own: what has no cycle serves, every cycle is refused naming a real one.

`SLOTSERVE_FUZZ_SCALE=10 pytest tests/fuzz` multiplies every example count for a longer run.

Where things are: lab.py (the models under test, the run settings, the statuses allowed), conftest.py (the
server), valid_requests.py (requests that must succeed), mutations.py (what breaks them), outcomes.py (how an
answer and the server afterwards are checked); the tests: test_infer_fuzz.py (unary, one at a time and in
bursts), test_stream_fuzz.py, test_shared_memory_fuzz.py, test_undecodable_bytes.py, test_long_strings.py,
test_absurd_shapes.py, test_message_size_limit.py.

test_numbers_fuzz.py has a server of its own (management allowed, an admission ceiling): NaN, infinities, negatives
and huge numbers in every numeric field of RegisterModel (admission_timeout_seconds, slots, backend options,
config_json's numbers) and in every numeric flag of the server.
"""
