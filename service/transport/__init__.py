"""The transport: gRPC servicers and the protocol's conversions, ModelInfer's wire format and tensors,
access tokens and TLS, the status-code table, shared memory and the tensor memory account (docs/architecture.md)."""
