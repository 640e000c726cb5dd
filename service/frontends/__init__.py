"""Front-end processes (`--frontends N`): N processes share the gRPC port (SO_REUSEPORT) and do HTTP/2, TLS and
each call's bytes; admission, residency, management and the engines stay in the one admission process (the
`Server`'s own), so every contract cell keeps one owner.

The folder is the design:

* `messages.py`: the typed records that cross a front end's link, one dataclass per kind (never tuples);
* `link.py`: their framing over the Unix socket pair between a front end and the admission process;
* `frontend.py` (`python -m service.frontends`): the front-end process: a gRPC server whose every method is
  forwarded over its link, health answered from the readiness the admission process pushes;
* `supervisor.py` (admission process): reserves the port, starts, watches, replaces and stops the front ends;
* `forwarded.py` (admission process): runs a forwarded call through the very servicer methods a direct gRPC call
  runs, behind a `ForwardedContext` (what the servicers use of grpc.ServicerContext).

With `--frontends 1` (the default) none of this is imported: the server is the one process it always was.
docs/architecture.md ("Processes") has the map.
"""
