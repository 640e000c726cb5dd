"""Loads with files (Triton's model-repository extension): RepositoryModelLoad's `file:<path>` parameters are
written to a private folder the server owns, and the model loads from there like any other.

Layout: one root per server (--model-files-dir's folder, else the system temporary folder) holding
`slotserve-model-files-<random>/` (created 0700 on first use, removed at shutdown), which holds one folder per load,
`<model>-<random>/`, with the files at their given relative paths. The root is one of the repository's allowed
roots, so the registry's path checks (ModelRoots) apply unchanged.

A load's folder is removed when the model no longer uses it: after a later load replaced it, after a failed load
that did not commit it (an error, a client that gave up), after RepositoryModelUnload, and at shutdown. A load
staged while the server shuts down removes what it wrote itself: `remove_all` marks the files closed, and a stage
that finds them closed (when it starts or once its writes are done) removes the whole root again and is refused.

The model's name is checked (engine.config.repository.check_model_name) before anything is created, and every folder
made is checked to be a direct child of the root: nothing is ever written outside --model-files-dir.

Locking: `_lock` guards `_folders`, `_pending` and `_closed`, held for set work only, never across file writes or
loads.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from engine.config.repository import check_model_name

from .core.errors import InvalidRequest, ServiceError, ShuttingDown

_LOG = logging.getLogger(__name__)

NAME_MAX = 255  # bytes of one path component (Linux's NAME_MAX)
DEFAULT_MAX_LOAD_FILE_BYTES = 1 << 30  # 1 GiB, as much as the default --max-message-bytes carries


TRITON_POLL_FAILED = "failed to poll from model repository"  # Triton 2.51's words for a load it cannot read


class RepositoryPollFailed(ServiceError):
    """RepositoryModelLoad of a model the repository does not have, with a `file:` path that cannot be written
    inside the load's folder, or with files and no `config`. Triton 2.51 answers each with INTERNAL "failed to load
    'x', failed to poll from model repository", which its clients and tests read; slotserve gives the same code and
    words, then the reason."""

    error_reason = "repository_poll_failed"

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"failed to load '{model}', {TRITON_POLL_FAILED}: {reason}")


class InvalidModelName(ServiceError):
    """RepositoryModelLoad naming no usable model: a `/`, `..`, a newline, more than 128 characters. Refused with
    INVALID_ARGUMENT before anything is read or written (Triton 2.51 answers INTERNAL, or writes a load's files
    under such a name); the message starts with Triton's words, then says what a name may hold."""

    error_reason = "invalid_request_error"

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"failed to load {model!r}, {TRITON_POLL_FAILED}: {reason}")


class LoadFilesTooLarge(ServiceError):
    """The files of one RepositoryModelLoad exceed --max-load-file-bytes (RESOURCE_EXHAUSTED); nothing is
    written."""

    error_reason = "load_files_limit"


def file_name_problem(path: str) -> str | None:
    """Why `path` (a `file:` parameter's name without the prefix) cannot be written under a load's folder, or None.
    Refused: empty, absolute, `..` steps, empty components ("1//model.onnx", a trailing "/"), NUL, and a component
    longer than NAME_MAX bytes in UTF-8. A `.` step is harmless and accepted, as Triton does ("./1/model.onnx")."""
    if not path:
        return "the file name is empty"
    if "\x00" in path:
        return "a file name must not contain NUL"
    if path.startswith("/"):
        return "a file name must be relative (inside the model folder), not absolute"
    for component in path.split("/"):
        if component == "":
            return "a file name must not have empty components ('//' or a trailing '/')"
        if component == "..":
            return "a file name must not contain '..' steps"
        size = len(component.encode("utf-8", "surrogatepass"))
        if size > NAME_MAX:
            return f"a file name component is {size} bytes, more than NAME_MAX ({NAME_MAX})"
    if not _components(path):
        return "the file name names no file (only '.' steps)"
    return None


def _components(path: str) -> list[str]:
    return [component for component in path.split("/") if component != "."]


class ModelFiles:
    """The private folders of loads with files."""

    def __init__(self, parent: Path | None, max_bytes: int) -> None:
        parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        # Named now (the repository's allowed roots are fixed at construction), created on first use; the random
        # part makes it unguessable, and mkdir (never exist_ok) refuses a folder someone else made.
        self.root = parent.resolve() / f"slotserve-model-files-{secrets.token_hex(8)}"
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # guards: _folders, _pending
        self._folders: dict[str, set[Path]] = {}  # model -> its folders not removed yet
        self._pending: set[Path] = set()  # folders a load is still using (never removed under it)
        self._closed = False  # remove_all has run: no folder is made any more

    def owns(self, source: str) -> bool:
        """Whether `source` (a model's committed source) is one of this server's load folders."""
        return bool(source) and Path(source).parent == self.root

    def stage(self, model: str, files: Mapping[str, bytes], config_json: str) -> Path:
        """Check the model's name and the files and write them to a new folder inside the root; return it (pending
        until `done`). Raises ModelConfigError (a bad model name), InvalidRequest (a value that is not bytes),
        RepositoryPollFailed (no config, or a file name that cannot be written inside the folder: Triton's answer) or
        LoadFilesTooLarge, all before anything is written; ShuttingDown once `remove_all` has run. Whatever ends
        the writing (an OS error: InvalidRequest naming its reason; anything else as raised) removes what was
        written. Blocks for the writes."""
        check_model_name(model)
        if not config_json:  # Triton's code and words (its QA tests read them), then what is missing
            raise RepositoryPollFailed(
                model,
                "a load with files needs the 'config' parameter (the model's configuration as JSON), as Triton "
                "requires",
            )
        for name in files:
            problem = file_name_problem(name)
            if problem is not None:
                raise RepositoryPollFailed(model, f"file:{name!r}: {problem}")
            if not isinstance(files[name], bytes):
                raise InvalidRequest(f"model '{model}': file:{name}: the parameter must be bytes (bytes_param)")
        total = sum(len(content) for content in files.values())
        if total > self.max_bytes:
            raise LoadFilesTooLarge(
                f"model '{model}': the files of this load are {total} bytes, more than --max-load-file-bytes "
                f"({self.max_bytes})"
            )
        folder = self._new_folder(model)
        try:
            for name, content in files.items():
                _write_new(folder, name, content)
            self._refuse_if_closed()
        except BaseException as error:
            self.done(folder)
            self.sweep(model, None, only=folder)
            if self._is_closed():
                shutil.rmtree(self.root, ignore_errors=True)  # a write that raced remove_all may have left files
                if isinstance(error, Exception):
                    raise ShuttingDown("the server is shutting down: no more loads with files") from None
            if isinstance(error, OSError):
                raise InvalidRequest(f"model '{model}': cannot write its files: {error.strerror}") from None
            raise
        return folder

    def _new_folder(self, model: str) -> Path:
        self._refuse_if_closed()
        self.root.parent.mkdir(parents=True, exist_ok=True)  # --model-files-dir itself is made on the first load too
        try:
            self.root.mkdir(mode=0o700)
        except FileExistsError:
            pass  # ours: created by an earlier load (the random name makes a stranger's folder unlikely)
        folder = self.root / f"{model}-{secrets.token_hex(6)}"
        if folder.parent != self.root or len(folder.name.encode()) > NAME_MAX:  # check_model_name makes both hold
            raise InvalidRequest(f"model '{model}': its name cannot name a folder")
        folder.mkdir(mode=0o700)
        with self._lock:
            self._folders.setdefault(model, set()).add(folder)
            self._pending.add(folder)
        return folder

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _refuse_if_closed(self) -> None:
        if self._is_closed():
            raise ShuttingDown("the server is shutting down: no more loads with files")

    def done(self, folder: Path) -> None:
        """The load that staged `folder` has finished (committed or not); `sweep` may remove it now."""
        with self._lock:
            self._pending.discard(folder)

    def sweep(self, model: str, live_source: str | None, *, only: Path | None = None) -> None:
        """Remove `model`'s folders except the one it is served from (`live_source`) and those a load still uses."""
        live = Path(live_source) if live_source else None
        with self._lock:
            folders = self._folders.get(model, set())
            doomed = {f for f in folders if f != live and f not in self._pending and (only is None or f == only)}
            folders -= doomed
        for folder in doomed:
            shutil.rmtree(folder, ignore_errors=True)

    def remove_all(self) -> None:
        """At shutdown: remove the root and everything in it. A stage still writing then removes it again when it
        ends (it finds the files closed), so nothing it wrote after this outlives the server."""
        with self._lock:
            self._closed = True
            self._folders.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _write_new(folder: Path, name: str, content: bytes) -> None:
    """Write `content` to folder/name, creating its parent folders; never follows or replaces anything (the
    folder is new and ours, and O_EXCL refuses a name given twice in other spelling)."""
    components = _components(name)
    parent = folder
    for component in components[:-1]:  # never `parents=True`: a load folder removed meanwhile is not made again
        parent = parent / component
        try:
            parent.mkdir(mode=0o700)
        except FileExistsError:
            if parent.is_symlink() or not parent.is_dir():
                raise
    path = parent / components[-1]
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
