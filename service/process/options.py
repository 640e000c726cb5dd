"""Server options: one frozen record, validated once at startup and passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.interface import Backend

from ..core.rate_limiter import RateLimitMode, ResourceFlag
from ..core.trace_settings import TraceSettings
from ..request_path.model_control import DEFAULT_POLL_SECONDS, MODES
from ..request_path.model_files import DEFAULT_MAX_LOAD_FILE_BYTES
from ..transport.auth import Secret, secret_of
from ..transport.shared_memory import DEFAULT_MAX_BYTES, prefix_problem
from ..transport.tensor_memory import DEFAULT_IN_FLIGHT_BYTES, DEFAULT_REQUEST_BYTES

MAX_SLOTS = 16
DEFAULT_CONCURRENT_RPCS = 1024
MAX_CONCURRENT_RPCS = 100_000  # each open call may hold a handler thread (about 45 KiB, docs/operations.md)
DEFAULT_MESSAGE_BYTES = 1 << 30  # 1 GiB: a 256 MiB tensor plus protocol overhead fits with room to spare
# grpc takes its message limits as C ints: a larger value kills the server with an OverflowError after every
# model loaded. Below 64 KiB even a model's metadata or a management status may not fit.
MIN_MESSAGE_BYTES = 64 << 10
MAX_MESSAGE_BYTES = (1 << 31) - 1
# The longest any duration flag (and a management admission timeout) may be: a year is longer than any wait an
# operator means, and far below threading.TIMEOUT_MAX (~292 years), so sums of durations never overflow a wait.
MAX_SECONDS = 365 * 24 * 3600
MAX_WORKERS = 4096  # gRPC handler threads: each is an OS thread
MAX_PORT = 65535
MAX_FRONTENDS = 64  # front-end processes (--frontends)


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path = Path("demo/model_repository")
    # Folders outside the repository that model files may be in (--allow-model-root): a management `source`, a
    # `default_model_filename`, a symbolic link's target. Nothing else outside the repository is opened.
    allowed_model_roots: tuple[Path, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8001  # 0: any free port
    parallel_jobs: int | None = None  # None: one slot per model, explicit counts refused; N: parallel runtime
    allow_management: bool = False  # Management mutations and repository load/unload
    admission_timeout: float = 0.0  # server ceiling and default for every model, seconds; 0 = unbounded
    max_queue: int = 0  # per-model limit of queued requests; 0 = none
    refuse_predicted_wait: bool = False  # refuse at arrival a request whose deadline comes before its predicted turn
    load_at_startup: bool = True  # load every repository model before reporting ready
    max_concurrent_loads: int = 1  # simultaneous cold loads across models
    max_workers: int = 64  # gRPC handler threads kept; the handler budget (inference_handlers) is taken from them
    # Calls open at once, all kinds; each holds a handler thread (service/process/server.py). None: 1024, or
    # --max-workers when that is larger (so raising --max-workers alone never makes the two disagree).
    max_concurrent_rpcs: int | None = None
    # Threads running calls at once, beyond those waiting on an engine or a stream (service/process/handler_threads.py);
    # 0: every call at once on a thread of its own.
    handler_runners: int = 2
    control_threads: int = 8  # of max_workers, kept from inference: half for management, half for health and status
    max_message_bytes: int = DEFAULT_MESSAGE_BYTES
    reflection: bool = True
    max_resident_models: int = 0
    idle_unload: float = 0.0
    memory_budget: int = 0
    drain_seconds: float = 0.0
    shutdown_grace: float = 30.0
    stream_write_timeout: float = 30.0  # a stream message the client does not take within this ends the call
    metrics_port: int | None = None  # Prometheus text over HTTP on the same host; None: off; 0: any free port
    metrics_host: str | None = None  # the address metrics listen on (Triton's --metrics-address); None: `host`
    # A model that fails to load at startup stops the server (exit 1) instead of being listed with its reason
    # (Triton's --exit-on-error, true by default there).
    exit_on_error: bool = False
    strict_readiness: bool = False  # ServerReady false while a model loads or failed (Triton's default)
    # grpcio server arguments from Triton's --grpc-keepalive-* and --grpc-http2-* flags: (argument, value) pairs.
    grpc_arguments: tuple[tuple[str, int], ...] = ()
    reuse_port: bool = False  # SO_REUSEPORT on the gRPC port (Triton's --reuse-grpc-port)
    # Front-end processes sharing the gRPC port (service/frontends/); 1: this process serves it, as always.
    frontends: int = 1
    # The rate limiter (service/core/rate_limiter.py): Triton's --rate-limit and --rate-limit-resource.
    rate_limit: RateLimitMode = RateLimitMode.OFF
    rate_limit_resources: tuple[ResourceFlag, ...] = ()
    log_format: str = "text"
    # tritonserver's --log-verbose N, as LogSettings reads it back (slotserve logs one DEBUG level: 1 or more is DEBUG).
    log_verbose_level: int = 0
    extra_backends: dict[str, Backend] = field(
        default_factory=dict, compare=False
    )  # name -> Backend, for tests and plugins
    enable_test_backends: bool = False  # register engine/testing/'s doubles (backend "fixture"): tests only
    # Security (service/transport/auth.py, service/transport/tls.py). Tokens may be given as str; they are kept as
    # Secret, which never prints itself, so logging these options shows no token.
    management_token: Secret | None = None  # management and repository control need it (and --allow-management)
    inference_token: Secret | None = None  # every other call except health probes needs it (or the above)
    tls_cert: Path | None = None  # PEM certificate chain; with tls_key: serve TLS only
    tls_key: Path | None = None  # PEM private key (unencrypted)
    tls_client_ca: Path | None = None  # PEM CA bundle: require client certificates signed by it (mutual TLS)
    # System shared memory (service/transport/shared_memory.py): off unless "system"; keys must start with the prefix;
    # the bytes mapped at once are bounded.
    shared_memory: str = "none"
    shared_memory_prefix: str = "/"
    shared_memory_max_bytes: int = DEFAULT_MAX_BYTES
    # Decoded request tensors (service/transport/tensor_memory.py), bytes; 0 = no limit.
    max_request_tensor_bytes: int = DEFAULT_REQUEST_BYTES
    max_inflight_tensor_bytes: int = DEFAULT_IN_FLIGHT_BYTES
    # Model control (service/request_path/model_control.py, docs/model-control.md): lazy is slotserve's own mode (a
    # request loads an unloaded model); none, explicit and poll are Triton's.
    model_control_mode: str = "lazy"
    load_models: tuple[str, ...] = ()  # --load-model: explicit mode's startup loads; "*" for all
    repository_poll_seconds: float = DEFAULT_POLL_SECONDS
    # Loads with files (service/request_path/model_files.py): where their private folder is made (None: the system
    # temporary folder) and the most bytes one load may write.
    model_files_dir: Path | None = None
    max_load_file_bytes: int = DEFAULT_MAX_LOAD_FILE_BYTES
    # Python models' packed execution environments (engine/python/environments.py): where they are extracted (None:
    # <the system temporary folder>/slotserve-python-environments), made at the first such load.
    python_environments_dir: Path | None = None
    response_cache_bytes: int = 0  # service/request_path/response_cache.py; 0 = no response cache
    # Request tracing at startup (--trace-config: service/core/trace_settings.py); the default traces nothing.
    trace_settings: TraceSettings = field(default_factory=TraceSettings)

    def __post_init__(self) -> None:
        problems = self._normalize_security()
        problems += self._model_root_problems()
        problems += self._number_problems()
        if not isinstance(self.host, str) or not self.host.strip():
            problems.append(f"--host must name an address (0.0.0.0 for every interface), got {self.host!r}")
        if (
            self.metrics_port is not None
            and self.metrics_port == self.port != 0
            and self.metrics_host in (None, self.host)
        ):
            problems.append(f"--metrics-port must differ from --port ({self.port})")
        if self.metrics_host is not None and (not isinstance(self.metrics_host, str) or not self.metrics_host.strip()):
            problems.append(f"--metrics-address must name an address, got {self.metrics_host!r}")
        object.__setattr__(self, "grpc_arguments", tuple(tuple(pair) for pair in self.grpc_arguments))
        problems += self._shared_memory_problems()
        problems += self._model_control_problems()
        if self.log_format not in ("text", "json"):
            problems.append(f"--log-format must be text or json, got {self.log_format}")
        if problems:
            raise ValueError("; ".join(problems))

    def _number_problems(self) -> list[str]:
        """Every numeric option against its range (RANGES): NaN, infinities, negatives and values a layer below
        cannot hold (grpc's int32 message limit) are refused here, before anything loads, each naming its flag
        and its range. Comparisons are written so that NaN fails them."""
        problems = []
        for name, (flag, low, high, kind) in RANGES.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL_NUMBERS:
                continue
            if name == "max_workers" and _in_range(self.control_threads, *RANGES["control_threads"][1:]):
                low = self.control_threads + 1  # inference needs at least one thread of its own
            if name == "max_concurrent_rpcs" and _in_range(self.max_workers, *RANGES["max_workers"][1:]):
                low = max(low, self.max_workers)  # every kept handler thread must be able to hold a call
            if not _in_range(value, low, high, kind):
                why = f" ({self.control_threads} of them are kept for control calls)" if name == "max_workers" else ""
                shown = (
                    f"--max-workers ({low})..{high}"
                    if name == "max_concurrent_rpcs" and low == self.max_workers
                    else range_text(low, high, kind)
                )
                problems.append(f"{flag} must be {shown}{why}, got {value!r}")
        return problems

    @property
    def concurrent_rpcs(self) -> int:
        """The bound on calls open at once that the gRPC server applies (--max-concurrent-rpcs or its default)."""
        if self.max_concurrent_rpcs is not None:
            return self.max_concurrent_rpcs
        return max(DEFAULT_CONCURRENT_RPCS, self.max_workers)

    @property
    def inference_handlers(self) -> int:
        """How many inference calls may occupy handler threads at once; the rest are refused as busy."""
        return self.max_workers - self.control_threads

    @property
    def management_handlers(self) -> int:
        """How many management calls (which can wait without limit: bulk unload always does) may occupy the
        control threads at once; the rest of those threads always serve health, readiness and status calls,
        which never wait."""
        return max(1, self.control_threads // 2)

    def _model_root_problems(self) -> list[str]:
        """Keep the allowed roots as a tuple of Paths; each must be an existing folder."""
        roots = tuple(Path(root) for root in self.allowed_model_roots or ())  # argparse gives None for none
        object.__setattr__(self, "allowed_model_roots", roots)
        return [f"--allow-model-root {root} is not a folder" for root in roots if not root.is_dir()]

    def _model_control_problems(self) -> list[str]:
        """--model-control-mode and the flags that go with it."""
        object.__setattr__(self, "load_models", tuple(self.load_models or ()))
        if self.model_files_dir is not None:
            object.__setattr__(self, "model_files_dir", Path(self.model_files_dir))
        mode = self.model_control_mode
        if mode not in MODES:
            return [f"--model-control-mode must be one of {', '.join(MODES)}, got {mode!r}"]
        problems = []
        if self.load_models and mode != "explicit":
            problems.append(f"--load-model needs --model-control-mode explicit (the mode is {mode})")
        if not self.load_at_startup and mode != "lazy":
            problems.append(
                f"--no-load-at-startup belongs to --model-control-mode lazy; with {mode} use explicit without "
                "--load-model to start with nothing loaded"
            )
        if self.idle_unload and mode != "lazy":
            problems.append(
                f"--idle-unload needs --model-control-mode lazy: under {mode} no request loads a retired model again"
            )
        # A folder that does not exist yet is made on the first load with files: nothing is written at startup.
        if self.model_files_dir is not None and self.model_files_dir.exists() and not self.model_files_dir.is_dir():
            problems.append(f"--model-files-dir {self.model_files_dir} is not a folder")
        if self.python_environments_dir is not None:
            object.__setattr__(self, "python_environments_dir", Path(self.python_environments_dir))
            if self.python_environments_dir.exists() and not self.python_environments_dir.is_dir():
                problems.append(f"--python-environments-dir {self.python_environments_dir} is not a folder")
        return problems

    def _shared_memory_problems(self) -> list[str]:
        problems = []
        if self.shared_memory not in ("none", "system"):
            problems.append(
                f"--shared-memory must be none or system, got {self.shared_memory}"
                + (" (CUDA shared memory is not supported yet)" if self.shared_memory == "cuda" else "")
            )
        problem = prefix_problem(self.shared_memory_prefix)
        if problem is not None:
            problems.append(problem)
        return problems

    def _normalize_security(self) -> list[str]:
        """Turn token strings into Secrets and paths into Paths (the record is frozen, hence object.__setattr__);
        the problems found, for __post_init__ to report with the others. No message contains a token."""
        problems = []
        for name, flag in (("management_token", "--management-token"), ("inference_token", "--inference-token")):
            try:
                object.__setattr__(self, name, secret_of(getattr(self, name), flag))
            except ValueError as error:
                problems.append(str(error))
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        if self.management_token is not None and not self.allow_management:
            # One switch decides whether management exists; the token only decides who may use it. A token
            # without the switch is a misconfiguration, so it is refused instead of silently changing either.
            problems.append(
                "--management-token needs --allow-management (the token restricts management; it does not enable it)"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            problems.append("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            problems.append("--tls-client-ca needs --tls-cert and --tls-key")
        return problems


# Every numeric option: field -> (flag, lowest, highest, kind). kind "int" takes integers only (highest None: no
# upper bound, for counts and byte budgets that Python compares exactly); "seconds" a finite number of seconds;
# "positive seconds" the same above 0. tests/unit/test_flag_ranges.py checks that every int or float flag of
# service/process/flags.py is here.
RANGES: dict[str, tuple[str, float, float | None, str]] = {
    "port": ("--port", 0, MAX_PORT, "int"),
    "parallel_jobs": ("--parallel-jobs", 1, MAX_SLOTS, "int"),
    "admission_timeout": ("--admission-timeout", 0, MAX_SECONDS, "seconds"),
    "max_queue": ("--max-queue", 0, None, "int"),
    "max_concurrent_loads": ("--max-concurrent-loads", 1, None, "int"),
    "max_workers": ("--max-workers", 2, MAX_WORKERS, "int"),
    "max_concurrent_rpcs": ("--max-concurrent-rpcs", 1, MAX_CONCURRENT_RPCS, "int"),
    "handler_runners": ("--handler-runners", 0, MAX_WORKERS, "int"),
    "frontends": ("--frontends", 1, MAX_FRONTENDS, "int"),
    "control_threads": ("control_threads", 1, MAX_WORKERS - 1, "int"),
    "max_message_bytes": ("--max-message-bytes", MIN_MESSAGE_BYTES, MAX_MESSAGE_BYTES, "int"),
    "max_resident_models": ("--max-resident-models", 0, None, "int"),
    "idle_unload": ("--idle-unload", 0, MAX_SECONDS, "seconds"),
    "memory_budget": ("--memory-budget", 0, None, "int"),
    "drain_seconds": ("--drain-seconds", 0, MAX_SECONDS, "seconds"),
    "shutdown_grace": ("--shutdown-grace", 0, MAX_SECONDS, "seconds"),
    "stream_write_timeout": ("--stream-write-timeout", 0, MAX_SECONDS, "positive seconds"),
    "metrics_port": ("--metrics-port", 0, MAX_PORT, "int"),
    "shared_memory_max_bytes": ("--shared-memory-max-bytes", 1, None, "int"),
    "max_request_tensor_bytes": ("--max-request-tensor-bytes", 0, None, "int"),
    "max_inflight_tensor_bytes": ("--max-inflight-tensor-bytes", 0, None, "int"),
    "repository_poll_seconds": ("--repository-poll-seconds", 0, MAX_SECONDS, "positive seconds"),
    "max_load_file_bytes": ("--max-load-file-bytes", 0, None, "int"),
    "response_cache_bytes": ("--response-cache-bytes", 0, None, "int"),
}
OPTIONAL_NUMBERS = frozenset({"parallel_jobs", "metrics_port", "max_concurrent_rpcs"})  # None: not set


def _in_range(value: object, low: float, high: float | None, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int) and low <= value and (high is None or value <= high)
    if not isinstance(value, (int, float)) or high is None:  # only "int" numbers are unbounded above
        return False
    # Written so that NaN is out of range (every comparison with NaN is false).
    return (low < value <= high) if kind == "positive seconds" else (low <= value <= high)


def range_text(low: float, high: float | None, kind: str) -> str:
    """How a range reads in a refusal: "0..65535", ">= 0", "0..31536000 seconds", "more than 0 and at most ..."."""
    if kind == "int" and high is None:
        return "> 0" if low == 1 else f">= {low}"
    if kind == "int":
        return f"{low}..{high}"
    year = " (a year)" if high == MAX_SECONDS else ""
    if kind == "positive seconds":
        return f"more than 0 and at most {high} seconds{year}"
    return f"{low}..{high} seconds{year}"


def seconds_problem(name: str, value: float, *, zero: str) -> str | None:
    """Why `value` cannot be the duration `name` (a management field), or None: like the duration flags it must
    be a number of seconds 0..MAX_SECONDS (`zero` says what 0 means); NaN and infinities are refused."""
    if _in_range(value, 0, MAX_SECONDS, "seconds"):
        return None
    return f"{name} must be {range_text(0, MAX_SECONDS, 'seconds')} (0 {zero}), got {value!r}"
