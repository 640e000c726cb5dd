"""Design 3b: several grpc.aio front-end processes on one port (`grpc.so_reuseport`), each forwarding a call's
bytes over a Unix socket to one model process, which runs slotserve's core with design 2's scheduling
(bench/transport/dispatch.py: fast models inline on its loop, others on slot threads).

    python -m bench.transport.multiproc [--port 0] [--front-ends N] [--threshold-us 200] -- SLOTSERVE FLAGS...

The model process (this one) binds the port first (SO_REUSEPORT, not listening) to reserve it, starts N front ends
(default: the CPUs it may run on), and prints `multiproc listening on 127.0.0.1:PORT` once they all serve. The
kernel spreads *connections* over the front ends, so a client with one channel reaches one front end.

What crosses the socket: one frame per call, `<IIBd` (call id, payload bytes, method index, seconds left or -1)
and the serialized request; one back, `<IIi` (call id, payload bytes, status code: 0 OK) and the serialized
response or the error's details. Decoding stays in the model process, so that admission and the tensor memory
account see the request as today; the front ends only speak HTTP/2. A prototype: unary methods only, the client's
cancellation is not forwarded (a deadline is), the rich error details are dropped (the status code and message
are kept).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.transport import adapter  # noqa: E402
from bench.transport.aio_inline import GRPC_OPTIONS  # noqa: E402
from bench.transport.dispatch import Dispatcher, loop_deadline, run_until_signalled  # noqa: E402

CALL = struct.Struct("<IIBd")  # call id, payload bytes, method index, seconds left (-1: none)
REPLY = struct.Struct("<IIi")  # call id, payload bytes, grpc status code value (0: OK)
NAMES = sorted(m.name for m in adapter.SERVICE.methods if not (m.client_streaming or m.server_streaming))
CODES = {code.value[0]: code for code in grpc.StatusCode}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="model", choices=("model", "front-end"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--front-ends", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--socket", help="(front end) the model process's Unix socket")
    parser.add_argument("--threshold-us", type=float, default=200.0)
    parser.add_argument("--threads", type=int, default=2)
    own, slotserve = adapter.split_argv(argv)
    args = parser.parse_args(own)
    args.slotserve = slotserve
    return args


# ------------------------------------------------------------------------------------------- model process


def _reply(writer, call_id: int, code: int, payload: bytes) -> None:
    writer.writelines((REPLY.pack(call_id, len(payload), code), payload))


def _outcome(dispatcher: Dispatcher, name: str, request, shim) -> tuple[int, bytes]:
    try:
        return 0, dispatcher.run_inline(name, request, shim)
    except adapter.Abort as status:
        return status.code.value[0], status.details.encode()


async def _threaded(dispatcher, writer, call_id, name, request, shim) -> None:
    try:
        code, payload = 0, await dispatcher.run_on_thread(name, request, shim)
    except adapter.Abort as status:
        code, payload = status.code.value[0], status.details.encode()
    _reply(writer, call_id, code, payload)


def _serve_connection(dispatcher: Dispatcher):
    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                call_id, size, index, left = CALL.unpack(await reader.readexactly(CALL.size))
                data = await reader.readexactly(size)
                name = NAMES[index]
                try:
                    request = dispatcher.methods[name].deserialize(data)
                except Exception as error:
                    _reply(writer, call_id, grpc.StatusCode.INVALID_ARGUMENT.value[0], str(error).encode())
                    continue
                shim = adapter.ShimContext(None if left < 0 else time.monotonic() + left)
                if dispatcher.inline(name, request):
                    code, payload = _outcome(dispatcher, name, request, shim)
                    _reply(writer, call_id, code, payload)
                else:
                    asyncio.get_running_loop().create_task(_threaded(dispatcher, writer, call_id, name, request, shim))
        except asyncio.IncompleteReadError:
            writer.close()

    return on_connection


def _reserve_port(host: str, port: int) -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((host, port))
    return holder


async def model_process(args, stop: asyncio.Event) -> None:
    core = adapter.core_server(args.slotserve)
    methods = adapter.unary_methods(adapter.inference_servicer(core))
    dispatcher = Dispatcher(
        asyncio.get_running_loop(), core, methods, threshold_us=args.threshold_us, threads=args.threads
    )
    folder = tempfile.mkdtemp(prefix="slotserve-multiproc-")
    path = os.path.join(folder, "model.sock")
    unix_server = await asyncio.start_unix_server(_serve_connection(dispatcher), path)
    holder = _reserve_port(args.host, args.port)
    port = holder.getsockname()[1]
    children = []
    for _ in range(args.front_ends):
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.transport.multiproc", "front-end", "--host", args.host,
            "--port", str(port), "--socket", path, cwd=str(ROOT), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        if b"serving" not in line:
            raise RuntimeError(f"a front end did not start: {line!r}")
        children.append(child)
    holder.close()
    print(f"multiproc listening on {args.host}:{port} ({len(children)} front ends)", flush=True)
    await stop.wait()
    for child in children:
        child.terminate()
    for child in children:
        await child.wait()
    print(
        f"multiproc: {dispatcher.inline_calls} calls inline, {dispatcher.thread_calls} on threads",
        file=sys.stderr,
        flush=True,
    )
    unix_server.close()
    dispatcher.close()
    core.stop(grace=1)
    os.unlink(path)
    os.rmdir(folder)


# ---------------------------------------------------------------------------------------------- front end


async def front_end(args, stop: asyncio.Event) -> None:
    reader, writer = await asyncio.open_unix_connection(args.socket)
    loop = asyncio.get_running_loop()
    pending: dict[int, asyncio.Future] = {}
    ids = itertools.count(1)

    async def read_replies() -> None:
        while True:
            call_id, size, code = REPLY.unpack(await reader.readexactly(REPLY.size))
            payload = await reader.readexactly(size)
            future = pending.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result((code, payload))

    def make(index: int):
        async def forward(data: bytes, context) -> bytes:
            call_id = next(ids) & 0xFFFFFFFF
            future = loop.create_future()
            pending[call_id] = future
            deadline = loop_deadline(context)
            left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            writer.writelines((CALL.pack(call_id, len(data), index, left), data))
            code, payload = await future
            if code:
                await context.abort(CODES.get(code, grpc.StatusCode.UNKNOWN), payload.decode(errors="replace"))
            return payload

        return forward

    replies = loop.create_task(read_replies())
    table = {name: grpc.unary_unary_rpc_method_handler(make(i)) for i, name in enumerate(NAMES)}
    server = grpc.aio.server(options=GRPC_OPTIONS + [("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(adapter.SERVICE_NAME, table),))
    server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    print("front end serving", flush=True)
    await stop.wait()
    await server.stop(0.5)
    replies.cancel()
    writer.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    role = model_process if args.role == "model" else front_end
    run_until_signalled(lambda stop: role(args, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
