"""Model control: which models load when, and who may load and unload them (--model-control-mode).

Modes (docs/model-control.md):

- `lazy` (the default, slotserve's own): every repository model is registered at startup and loaded then (unless
  --no-load-at-startup); a request for an unloaded model loads it (the one initializer); repository load and
  unload work.
- `none` (Triton's): every repository model is loaded at startup; RepositoryModelLoad and RepositoryModelUnload
  are refused with Triton's answer; a model that failed to load stays unloaded.
- `explicit` (Triton's): only the --load-model names load at startup (`*`: all); a model loads only by
  RepositoryModelLoad and stays unloaded after RepositoryModelUnload: a request never loads it.
- `poll` (Triton's): like `none`, and the repository is rescanned every --repository-poll-seconds: an added,
  changed or removed model folder is loaded, reloaded or unloaded through the registry's validated path (a folder
  that does not read yet is retried when it changes again, and a served model keeps serving meanwhile).

Only `lazy` loads a model on a request; the other modes tell the request why not (ModelNotLoadedByControl).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from engine.config.ensemble_graph import MAX_NESTING
from engine.config.files import SKIPPED_FOLDERS, read_regular_file
from engine.config.repository import check_model_name
from engine.errors import ModelConfigError
from engine.interface import CancelToken

from .core.errors import InvalidRequest, ModelConfigFailed, ModelNotFound, ServiceError, own_copy
from .core.events import Events
from .core.registry import ModelRegistry, Registration
from .core.residency import COLD_LOAD_TURN_SECONDS
from .model_files import TRITON_POLL_FAILED, InvalidModelName, ModelFiles, RepositoryPollFailed

_LOG = logging.getLogger(__name__)

MODES = ("lazy", "none", "explicit", "poll")
LOAD_ALL = "*"
DEFAULT_POLL_SECONDS = 15.0  # Triton's --repository-poll-secs default


TRITON_CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"  # Triton 2.51's words


class RepositoryControlDisabled(ServiceError):
    """RepositoryModelLoad / RepositoryModelUnload in a mode without explicit control (none, poll). Triton answers
    UNAVAILABLE with this wording in both modes, so stock clients see what they see from Triton."""

    error_reason = "model_control_disabled"

    def __init__(self, mode: str) -> None:
        message = TRITON_CONTROL_DISABLED
        if mode != "poll":  # Triton says "polling" in none mode too; clients match the prefix, people read on
            message += f" (the server runs with --model-control-mode {mode}; explicit mode loads and unloads)"
        super().__init__(message)


def lazy_load_refusal(mode: str) -> str:
    """What a request for an unloaded model is told in `mode` (appended to "model 'x' is not loaded"); "" in lazy
    mode, where the request loads it."""
    return {
        "lazy": "",
        "none": "--model-control-mode none: models load only at startup",
        "explicit": "--model-control-mode explicit: load it with RepositoryModelLoad",
        "poll": "--model-control-mode poll: it loads when its repository folder changes",
    }[mode]


HASHED_BYTES = 64 << 10  # files up to this size (config.pbtxt, small models) are compared by content too


# A model folder as the poller compares it: (path, size, mtime in ns, digest, kind) per file, sorted.
Fingerprint = tuple[tuple[str, int, int, str, str], ...]


def folder_fingerprint(directory: Path) -> Fingerprint:
    """What the poller compares between scans: every file under `directory` with its size and modification time
    (nanoseconds), and the content's digest for regular files up to HASHED_BYTES: a rewrite of config.pbtxt within
    the file system's timestamp granularity (milliseconds on some) that keeps its size is still seen. A file added
    or removed changes the list. `__pycache__` folders (the python worker's imports write them) are left out, so a
    python model's first load is no change. Only regular files are opened, without blocking: a FIFO, socket or
    device counts by its kind and times (opening a FIFO would stop the poller for good; reading /dev/zero would
    never end). An unreadable folder gives an empty tuple (retried when it reads differently)."""
    found = []
    try:
        for folder, dirs, files in os.walk(directory):
            dirs[:] = [name for name in dirs if name not in SKIPPED_FOLDERS]
            for name in files:
                path = Path(folder, name)
                try:
                    info = path.stat()
                except OSError:
                    continue  # removed while scanning, or a dangling link: the next scan sees the folder settled
                regular = stat.S_ISREG(info.st_mode)
                digest = _digest(path) if regular and info.st_size <= HASHED_BYTES else ""
                kind = "" if regular else stat.filemode(info.st_mode)[0]
                found.append((str(path.relative_to(directory)), info.st_size, info.st_mtime_ns, digest, kind))
    except OSError:
        return ()
    return tuple(sorted(found))


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(read_regular_file(path, "", None)).hexdigest()  # never blocks: O_NONBLOCK, fstat
    except ModelConfigError:
        return ""


@dataclass(frozen=True)
class ControlSettings:
    mode: str = "lazy"
    load_models: tuple[str, ...] = ()  # --load-model (explicit mode only); "*" loads every repository model
    poll_seconds: float = DEFAULT_POLL_SECONDS
    load_at_startup: bool = True  # lazy mode's --no-load-at-startup


class ModelControl:
    """The server's model-control policy: startup loading, repository load/unload (with files), the poller.

    Repository calls block like the registry's register/unload (bounded by the model's admission timeout).
    """

    def __init__(self, settings: ControlSettings, registry: ModelRegistry, files: ModelFiles) -> None:
        self.settings = settings
        self.registry = registry
        self.files = files
        self._poll_lock = threading.Lock()  # guards: _seen (one scan at a time)
        self._seen: dict[str, Fingerprint] = {}  # model folder -> the fingerprint last acted on
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def mode(self) -> str:
        return self.settings.mode

    # ---- startup and shutdown -------------------------------------------------------------------------------

    def start(self) -> None:
        """Register the repository's models, then load what the mode says; start the poller in poll mode. Every
        model is registered (listed, found by requests) before the first load. A model that fails is logged
        (not_loaded_at_startup) and stays unloaded; startup goes on. Loads run one after another, in the
        repository's load order, except that a load still running after a cold-load turn (COLD_LOAD_TURN_SECONDS)
        goes on beside the next ones: a hung initialize delays the others by one turn, not its whole bound.
        Returns once every startup load has ended (each within its own bound; the shutdown stops them)."""
        mode = self.settings.mode
        if mode == "poll":
            self._remember_all()  # before loading: a change made during the startup loads is seen by the next scan
        self.registry.register_repository(load=False)
        if mode == "explicit":
            self._load_named(self.settings.load_models)
        elif mode != "lazy" or self.settings.load_at_startup:
            registered = {entry.name for entry in self.registry.entries()}  # a refused configuration was logged
            names = [name for name in self.registry.repository.names() if name in registered]
            self._load_in_turns(names, lambda name: self.registry.load_registered(name, None))
        if mode == "poll":
            self._thread = threading.Thread(target=self._poll_forever, name="repository-poller", daemon=True)
            self._thread.start()

    def _load_named(self, names: Iterable[str]) -> None:
        names = list(names)
        if LOAD_ALL in names:
            names = self.registry.repository.names()
        self._load_in_turns(names, self.registry.load)

    def _load_in_turns(self, names: Iterable[str], load: Callable[[str], object]) -> None:
        """`load(name)` for each of `names` in load order (an ensemble after its steps), each on a thread of its
        own that the next one waits for one cold-load turn at most; then wait for the loads still running. A
        failure is logged (not_loaded_at_startup), never raised."""
        guard = self.registry.runtime.cold_loads
        turn = guard.turn_seconds if guard is not None else COLD_LOAD_TURN_SECONDS
        running = []
        for name in self.registry.repository.load_order(dict.fromkeys(names)):
            startup_load = _StartupLoad(name, load, self.registry.runtime.events)
            if not startup_load.done.wait(turn if turn > 0 else None):
                running.append(startup_load)  # past its turn: it goes on beside the next ones
        for startup_load in running:
            startup_load.done.wait()  # bounded by the load's own bound; the shutdown stops it (stop_loads)

    def stop_polling(self) -> None:
        """No scan starts after this (one under way finishes)."""
        self._stop.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop every load in progress and refuse later ones (a hung python initialize is killed: registry's
        stop_loads), stop the poller, waiting up to `timeout` seconds in all for a scan under way (None: without
        limit; a scan stops after the load it is in) and for the loads whose callers left, and remove the files of
        loads with files (a model still open on them keeps its open files: the OS frees them when it closes)."""
        self.registry.stop_loads(SHUTTING_DOWN)
        self._stop.set()
        ends = None if timeout is None else time.monotonic() + timeout
        if self._thread is not None:
            self._thread.join(timeout)
        # Loads whose callers left (service/core/detached.py): a load a backend cannot stop may still publish.
        if not self.registry.detached.wait_idle(None if ends is None else max(0.0, ends - time.monotonic())):
            _LOG.warning("shutdown: %d load(s) left by their callers still run", self.registry.detached.running)
        self.files.remove_all()

    # ---- repository load / unload (Triton's model-repository extension) -------------------------------------

    def load(self, name: str, parameters: Mapping[str, object], cancel: CancelToken | None = None) -> None:
        """RepositoryModelLoad: `parameters` maps "config" to a JSON string and "file:<path>" to bytes. Refused in
        none and poll mode. The model's name is checked first (InvalidModelName, INVALID_ARGUMENT: matched whole, so
        no newline, `/` or `..` ever reaches a path). With files they are written to a private folder first
        (ModelFiles.stage, which validates names and size before writing) and the model loads from there; the
        folder is removed however the load ends unless the model is served from it. Without files the model's
        repository folder is read again; a model the repository does not have is RepositoryPollFailed (Triton's
        answer). A change of the instance count alone is made while the model serves. Blocks until the load ends
        or `cancel` fires (the caller left: RequestCancelled; the load goes on, its outcome shown in the model's
        state: service/core/detached.py). Raises RepositoryControlDisabled, InvalidModelName,
        RepositoryPollFailed, InvalidRequest, LoadFilesTooLarge, or the registry's errors.

        A failure is told in Triton's words, which its clients and QA tests read: a version that failed to load
        "load failed for model 'x': version N is at UNAVAILABLE state: <why>" (the registry words it), a
        configuration or files that do not read "failed to load 'x', failed to poll from model repository: <why>"
        (with the error's own class: INVALID_ARGUMENT where Triton answers INTERNAL, docs/errors.md)."""
        self._check_explicit()
        try:
            check_model_name(name)  # before anything touches the disk: the name becomes a folder's name below
        except ModelConfigError as error:
            raise InvalidModelName(name, str(error)) from None
        try:
            self.registry.detached.run(
                lambda: self._load(name, parameters, cancel), cancel, f"repository load of '{name}'"
            )
        except (ModelConfigError, InvalidRequest) as error:
            worded = _poll_failed(name, error)
            if worded is error:
                raise
            raise worded from error.__cause__

    def _load(self, name: str, parameters: Mapping[str, object], cancel: CancelToken | None) -> None:
        """load's work (on a thread of its own when its caller may leave)."""
        config_json = parameters.get("config", "")
        assert isinstance(config_json, str)  # the servicer passes the string_param
        files = {key[len("file:") :]: value for key, value in parameters.items() if key.startswith("file:")}
        if not files:
            self._check_known(name)
            self._load_steps(name, config_json, cancel, {name}, depth=1)
            if self.files.owns(self._current_source(name)):  # leave a files load behind: read the folder again
                registration = Registration(name=name, source=name, config_json=config_json, resize_in_service=True)
                self.registry.register(registration, cancel=cancel)
                self.registry.reload_ensembles_of(name, cancel)
            else:  # the repository's folder; a failure there keeps the model listed with the new reason
                self.registry.load(name, config_json=config_json, cancel=cancel)
            self.files.sweep(name, self._current_source(name))
            return
        folder = self.files.stage(name, cast(Mapping[str, bytes], files), config_json)  # stage checks they are bytes
        try:
            registration = Registration(name=name, source=str(folder), config_json=config_json, resize_in_service=True)
            self.registry.register(registration, cancel=cancel)
        finally:
            self.files.done(folder)
            self.files.sweep(name, self._current_source(name))
        # As registry.load does, and as Triton's load returns: the ensembles waiting on this step are loaded again
        # before the call answers (the step watcher's reload after the "loaded" event comes too late for a client
        # that asks right after its load).
        self.registry.reload_ensembles_of(name, cancel)

    def _check_known(self, name: str) -> None:
        """A load without files of a model that is neither registered nor a folder of the repository gets Triton's
        answer (RepositoryPollFailed: INTERNAL "failed to load 'x', failed to poll from model repository"), with the
        folder slotserve looked for."""
        if name in self.registry.repository.names():
            return
        try:
            self.registry.get(name)
        except ModelNotFound:
            raise RepositoryPollFailed(name, f"no model folder '{name}' in the repository") from None
        except ModelConfigFailed:
            return  # listed as failed: reading it again reports its reason

    def _load_steps(self, name: str, config_json: str, cancel: CancelToken | None, seen: set[str], depth: int) -> None:
        """Before an ensemble loads from its repository folder: load each of its step models that is not loaded
        (Triton does; the steps of a step that is an ensemble too first). A step that fails to load is logged
        and left failed: the ensemble's own load then refuses it, naming the step. Unloading an ensemble leaves
        its steps loaded, as in Triton. `depth` is `name`'s place in the chain of ensembles: past MAX_NESTING the
        descent stops (the chain's load refuses it by name), so a chain of thousands is neither read nor loaded."""
        if depth > MAX_NESTING:
            return
        try:
            specs = self.registry.repository.read_versions(name, config_json=config_json)
        except Exception:  # noqa: BLE001 (not readable: the ensemble's own load reports it)
            return
        if not specs or specs[0].backend != "ensemble" or specs[0].config is None:
            return
        config: Any = specs[0].config  # the ModelConfig message (typed object in engine.interface)
        for step in dict.fromkeys(block.model_name for block in config.ensemble_scheduling.step):
            if step in seen:
                continue  # a cycle of ensembles: refused when they load
            seen.add(step)
            try:
                loaded = self.registry.get(step).status().loaded
            except (ModelNotFound, ModelConfigFailed):
                loaded = False
            if loaded:
                continue
            self._load_steps(step, "", cancel, seen, depth + 1)
            try:
                self.registry.load(step, cancel=cancel)
            except Exception as error:  # the ensemble's load names the step and its failure
                _LOG.warning("step model '%s' of ensemble '%s' did not load: %s", step, name, error)

    def unload(self, name: str, cancel: CancelToken | None = None) -> None:
        """RepositoryModelUnload; refused in none and poll mode. A model loaded with files loses them."""
        self._check_explicit()
        self.registry.unload(name, cancel=cancel)
        self.files.sweep(name, None)

    def _check_explicit(self) -> None:
        if self.settings.mode in ("none", "poll"):
            raise RepositoryControlDisabled(self.settings.mode)

    def _current_source(self, name: str) -> str:
        try:
            return self.registry.get(name).settings.source
        except (ModelNotFound, ModelConfigFailed):  # no entry (yet): nothing of a files load to leave behind
            return ""

    # ---- poll mode ------------------------------------------------------------------------------------------

    def _remember_all(self) -> None:
        with self._poll_lock:
            root = self.registry.repository.root
            self._seen = {name: folder_fingerprint(root / name) for name in self.registry.repository.names()}

    def _poll_forever(self) -> None:
        while not self._stop.wait(self.settings.poll_seconds):
            try:
                self.poll_once()
            except Exception:  # a scan that fails (a vanished repository) must not end polling
                _LOG.exception("repository scan failed; retrying in %s s", self.settings.poll_seconds)

    def poll_once(self) -> dict[str, list[str]]:
        """Scan the repository once (the poller calls it every --repository-poll-seconds; tests call it directly).
        A folder that appeared or whose files changed is loaded through the registry (a new model is registered
        then; a served one is reconfigured, which validates the new files before retiring anything, so a folder
        still being written never replaces the served model); a folder that went away is unloaded. An attempt
        that fails is logged (a WARNING naming the model) and retried when the folder changes again. Returns what
        this scan did: {"loaded": [...], "failed": [...], "unloaded": [...]}. Blocks while the loads run."""
        done: dict[str, list[str]] = {"loaded": [], "failed": [], "unloaded": []}
        with self._poll_lock:
            root = self.registry.repository.root
            names = self.registry.repository.names()
            for name in names:
                if self._stop.is_set():
                    return done  # shutting down: the rest waits (nothing is half done)
                fingerprint = folder_fingerprint(root / name)
                if self._seen.get(name) == fingerprint:
                    continue
                self._seen[name] = fingerprint
                try:
                    self.registry.load(name)
                    done["loaded"].append(name)
                except Exception as error:
                    _LOG.warning(
                        "model '%s': repository poll: not loaded (retried when its folder changes): %s", name, error
                    )
                    done["failed"].append(name)
            for name in sorted(set(self._seen) - set(names)):
                if self._stop.is_set():
                    return done
                del self._seen[name]
                try:
                    self.registry.unload(name)
                    done["unloaded"].append(name)
                except ModelNotFound:
                    pass  # it never read: nothing was registered
                except Exception as error:
                    _LOG.warning(
                        "model '%s': repository poll: its folder went away but unloading failed: %s", name, error
                    )
        return done


# What a load stopped by the shutdown is told (its model's last error).
SHUTTING_DOWN = "the server is shutting down"


class _StartupLoad:
    """One startup load on a thread of its own (ModelControl._load_in_turns); `done` is set when it has ended.
    The thread ends with the load: each load is bounded by its backend's limit and stopped by the shutdown."""

    def __init__(self, name: str, load: Callable[[str], object], events: Events) -> None:
        self.done = threading.Event()

        def run() -> None:
            try:
                load(name)
            except Exception as error:  # one broken model must not stop the others (Triton logs it too)
                events.emit(_LOG, "not_loaded_at_startup", name, error=str(error))
            finally:
                self.done.set()

        threading.Thread(target=run, name=f"startup load {name}"[:60], daemon=True).start()


def _poll_failed(name: str, error: Exception) -> Exception:
    """A load refused before any version of it loaded (its configuration or files do not read, or are refused), in
    Triton's words for it, "failed to load 'x', failed to poll from model repository: <why>", as a copy of `error`
    (its class, so its status code, kept). An error already in Triton's words (a version's failed load, a poll
    failure) is returned as it is."""
    text = str(error)
    if text.startswith(("load failed for model '", "failed to load '")):
        return error
    worded = own_copy(error)
    worded.args = (f"failed to load '{name}', {TRITON_POLL_FAILED}: {text}",)
    return worded  # type: ignore[return-value]  # own_copy keeps the class
