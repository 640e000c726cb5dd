"""The server core: admission (slots, FIFO, management leases, dynamic batching), the model lifecycle and its
pool, the registry of models, residency (eviction, idle retirement, memory budget, cold-load guard), statistics
the domain errors with their reasons, request outcomes and lifecycle events. Nothing here knows about gRPC or
protobuf messages, nor imports anything of service/ outside this folder: the transport (service.transport.servicers,
service.request_path.dataplane, service.transport.wire, service.transport.status_codes) sits above it, and
tests/unit/test_layers.py keeps it so.
"""
