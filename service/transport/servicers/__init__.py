"""gRPC servicers: thin adapters from protocol messages to the core (dataplane, registry). Each RPC decodes,
calls one core operation and encodes; errors go through service.transport.status_codes."""
