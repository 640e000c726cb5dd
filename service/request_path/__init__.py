"""The request path and its features, without gRPC: the dataplane, streams, the response cache,
ensembles, model control and loads with files, the server's calls to its own models (docs/architecture.md)."""
