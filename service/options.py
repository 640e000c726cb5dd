"""Server options: one frozen record, validated once at startup and passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .auth import Secret, secret_of
from .shared_memory import DEFAULT_MAX_BYTES, prefix_problem

MAX_SLOTS = 16
MAX_CONCURRENT_RPCS = 100_000  # each open call may hold a handler thread (about 45 KiB, docs/operations.md)
DEFAULT_MESSAGE_BYTES = 1 << 30  # 1 GiB: a 256 MiB tensor plus protocol overhead fits with room to spare


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path = Path("demo/model_repository")
    host: str = "127.0.0.1"
    port: int = 8001  # 0: any free port
    parallel_jobs: int | None = None  # None: one slot per model, explicit counts refused; N: parallel runtime
    allow_management: bool = False  # Management mutations and repository load/unload
    admission_timeout: float = 0.0  # server ceiling and default for every model, seconds; 0 = unbounded
    max_queue: int = 0  # per-model limit of queued requests; 0 = none
    load_at_startup: bool = True  # load every repository model before reporting ready
    max_concurrent_loads: int = 1  # simultaneous cold loads across models
    max_workers: int = 64  # gRPC handler threads kept; the handler budget (inference_handlers) is taken from them
    max_concurrent_rpcs: int = 1024  # calls open at once, all kinds; each holds a handler thread (service/server.py)
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
    log_format: str = "text"
    extra_backends: dict = field(default_factory=dict, compare=False)  # name -> Backend, for tests and plugins
    # Security (service/auth.py, service/tls.py). Tokens may be given as str; they are kept as Secret, which
    # never prints itself, so logging these options shows no token.
    management_token: Secret | None = None  # management and repository control need it (and --allow-management)
    inference_token: Secret | None = None  # every other call except health probes needs it (or the above)
    tls_cert: Path | None = None  # PEM certificate chain; with tls_key: serve TLS only
    tls_key: Path | None = None  # PEM private key (unencrypted)
    tls_client_ca: Path | None = None  # PEM CA bundle: require client certificates signed by it (mutual TLS)
    # System shared memory (service/shared_memory.py): off unless "system"; keys must start with the prefix; the
    # bytes mapped at once are bounded.
    shared_memory: str = "none"
    shared_memory_prefix: str = "/"
    shared_memory_max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        problems = self._normalize_security()
        if self.parallel_jobs is not None and not 1 <= self.parallel_jobs <= MAX_SLOTS:
            problems.append(f"--parallel-jobs must be 1..{MAX_SLOTS}, got {self.parallel_jobs}")
        if self.admission_timeout < 0:
            problems.append(f"--admission-timeout must be >= 0, got {self.admission_timeout}")
        if self.max_queue < 0:
            problems.append(f"--max-queue must be >= 0, got {self.max_queue}")
        if self.max_concurrent_loads < 1:
            problems.append(f"--max-concurrent-loads must be >= 1, got {self.max_concurrent_loads}")
        if self.control_threads < 1 or self.max_workers <= self.control_threads:
            problems.append(f"--max-workers ({self.max_workers}) must exceed the {self.control_threads} threads "
                            "kept for control calls")
        if not self.max_workers <= self.max_concurrent_rpcs <= MAX_CONCURRENT_RPCS:
            problems.append(f"--max-concurrent-rpcs must be --max-workers ({self.max_workers})..{MAX_CONCURRENT_RPCS}"
                            f", got {self.max_concurrent_rpcs}")
        if self.max_resident_models < 0:
            problems.append(f"--max-resident-models must be >= 0, got {self.max_resident_models}")
        if self.idle_unload < 0:
            problems.append(f"--idle-unload must be >= 0, got {self.idle_unload}")
        if self.memory_budget < 0:
            problems.append(f"--memory-budget must be >= 0, got {self.memory_budget}")
        if self.drain_seconds < 0 or self.shutdown_grace < 0:
            problems.append("--drain-seconds and --shutdown-grace must be >= 0")
        if self.stream_write_timeout <= 0:
            problems.append(f"--stream-write-timeout must be > 0, got {self.stream_write_timeout}")
        if not 0 <= self.port <= 65535:
            problems.append(f"--port must be 0..65535, got {self.port}")
        if self.metrics_port is not None:
            if not 0 <= self.metrics_port <= 65535:
                problems.append(f"--metrics-port must be 0..65535, got {self.metrics_port}")
            elif self.metrics_port == self.port != 0:
                problems.append(f"--metrics-port must differ from --port ({self.port})")
        problems += self._shared_memory_problems()
        if self.log_format not in ("text", "json"):
            problems.append(f"--log-format must be text or json, got {self.log_format}")
        if problems:
            raise ValueError("; ".join(problems))

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

    def _shared_memory_problems(self) -> list[str]:
        problems = []
        if self.shared_memory not in ("none", "system"):
            problems.append(f"--shared-memory must be none or system, got {self.shared_memory}"
                            + (" (CUDA shared memory is not supported yet)" if self.shared_memory == "cuda" else ""))
        problem = prefix_problem(self.shared_memory_prefix)
        if problem is not None:
            problems.append(problem)
        if self.shared_memory_max_bytes <= 0:
            problems.append(f"--shared-memory-max-bytes must be > 0, got {self.shared_memory_max_bytes}")
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
            problems.append("--management-token needs --allow-management (the token restricts management; "
                            "it does not enable it)")
        if (self.tls_cert is None) != (self.tls_key is None):
            problems.append("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            problems.append("--tls-client-ca needs --tls-cert and --tls-key")
        return problems
