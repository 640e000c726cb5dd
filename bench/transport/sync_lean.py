"""Design 3a: today's server with a grpcio setting that cuts thread switches: a fixed pool of `--workers` handler
threads (default: the CPUs this process may run on) in place of slotserve's thread per call.

    python -m bench.transport.sync_lean [--workers N] [--watchdog-ms MS] -- SLOTSERVE FLAGS...

Everything else is `python -m service` unchanged (prints `slotserve listening on ...`). What it gives up is why
service/process/handler_threads.py exists: with a fixed pool, calls that never send their message hold the threads and
every later call (health probes included) waits behind them.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--watchdog-ms",
        type=float,
        help="run calls on bench/transport/watchdog_pool.py: --workers runners, and after this many ms without a "
        "finished call a thread for each waiting call (design 3c)",
    )
    from bench.transport.adapter import split_argv
    from service.process import cli, server

    own, flags = split_argv(argv)
    args = parser.parse_args(own)

    # The one change: Server._build_grpc builds its executor through this name.
    if args.watchdog_ms:
        from bench.transport.watchdog_pool import WatchdogPool

        server.HandlerThreads = lambda keep, **_: WatchdogPool(args.workers, args.watchdog_ms / 1000)
    else:
        server.HandlerThreads = lambda keep, **_: ThreadPoolExecutor(args.workers, thread_name_prefix="grpc-fixed")
    return cli.main(flags)


if __name__ == "__main__":
    sys.exit(main())
