"""Design 2: slotserve's core behind a grpc.aio server; fast models run inline on the event loop, others on slot
threads with the hand-back batched per loop turn (bench/transport/dispatch.py).

    python -m bench.transport.aio_inline [--port 0] [--threshold-us 200] [--threads 2] -- SLOTSERVE FLAGS...

Prints `aio-inline listening on 127.0.0.1:PORT` once serving; SIGTERM stops it. A prototype: unary methods only
(ModelStreamInfer is not served), no health or reflection service, no graceful drain.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.transport import adapter  # noqa: E402
from bench.transport.dispatch import Dispatcher, loop_deadline, run_until_signalled  # noqa: E402

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 1 << 30),
    ("grpc.max_send_message_length", 1 << 30),
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threshold-us", type=float, default=200.0, help="mean run time under which calls run inline")
    parser.add_argument("--threads", type=int, default=2, help="slot threads for calls that do not run inline")
    own, slotserve = adapter.split_argv(argv)
    args = parser.parse_args(own)
    args.slotserve = slotserve
    return args


def handlers(dispatcher: Dispatcher) -> grpc.GenericRpcHandler:
    """A grpc.aio handler per unary method: deserialized by grpc (ModelInfer through service/transport/wire.py),
    answered with the bytes the dispatcher returns."""

    def make(name: str):
        async def handle(request, context):
            shim = adapter.ShimContext(loop_deadline(context), context.invocation_metadata())
            context.add_done_callback(lambda _call: shim.cancel())
            try:
                return await dispatcher.run(name, request, shim)
            except adapter.Abort as status:
                await context.abort(status.code, status.details, status.trailing_metadata)

        return handle

    table = {
        name: grpc.unary_unary_rpc_method_handler(make(name), request_deserializer=method.deserialize)
        for name, method in dispatcher.methods.items()
    }
    return grpc.method_handlers_generic_handler(adapter.SERVICE_NAME, table)


async def serve(args, stop: asyncio.Event) -> None:
    core = adapter.core_server(args.slotserve)
    methods = adapter.unary_methods(adapter.inference_servicer(core))
    dispatcher = Dispatcher(
        asyncio.get_running_loop(), core, methods, threshold_us=args.threshold_us, threads=args.threads
    )
    server = grpc.aio.server(options=GRPC_OPTIONS + [("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handlers(dispatcher),))
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    print(f"aio-inline listening on {args.host}:{port}", flush=True)
    await stop.wait()
    print(
        f"aio-inline: {dispatcher.inline_calls} calls inline, {dispatcher.thread_calls} on threads, "
        f"{dispatcher.wakeups} hand-back wake-ups",
        file=sys.stderr,
        flush=True,
    )
    await server.stop(1)
    dispatcher.close()
    core.stop(grace=1)


def main(argv=None) -> int:
    args = parse_args(argv)
    run_until_signalled(lambda stop: serve(args, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
