"""The server core: admission (slots, FIFO, management leases, dynamic batching), the model lifecycle and its
pool, the registry of models, residency (eviction, idle retirement, memory budget, cold-load guard), statistics
and the domain errors. Nothing here knows about gRPC or protobuf messages: the transport (service.servicers,
service.dataplane, service.wire, service.status_codes) sits above it, and tests/unit/test_layers.py keeps it so.
"""
