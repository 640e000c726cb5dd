"""A model's files: where they may be, how they are shown, how they are read, and what a reload compares of them.

Where model files may be (ModelRoots): every path a model names (its directory, a management request's `source`,
config.pbtxt, the model file, `default_model_filename`, a backend's file parameter such as TensorRT's
`trt_cache_dir`) is resolved, symbolic links followed, and must land inside the repository or inside a root the
operator allowed (--allow-model-root); anything else is refused with ModelConfigError naming the field, before
the file is opened. Messages for clients show paths relative to the repository (`shown`, `hide_paths`), never the
server's absolute paths.

Files are opened only when they are regular files (`read_regular_file`: a FIFO or a device named model.onnx would
block or worse). `files_stamp` (and `archive_stamp` for a python model's packed environment) is what a reload
compares to decide whether the engine can stay (ModelSpec.session_key).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelConfigError

ALLOW_ROOT_FLAG = "--allow-model-root"
# The folder part of an absolute path in free text ("/srv/models/" in "/srv/models/m/1/model.onnx"), not preceded
# by a character that would make it the tail of a relative path ("1/model.onnx") or of a word.
_ABSOLUTE_FOLDERS = re.compile(r"(?<![\w.~-])/(?:[^\s/'\"]+/)+")


@dataclass(frozen=True)
class ModelRoots:
    """Where a model's files may be: inside the repository, or inside a root the operator allowed with
    --allow-model-root. Both are kept resolved (symbolic links followed), so a check compares real places."""

    repository: Path
    allowed: tuple[Path, ...] = ()

    @classmethod
    def of(cls, repository: Path | str, allowed: Iterable[Path | str] = ()) -> ModelRoots:
        return cls(Path(repository).resolve(), tuple(Path(root).resolve() for root in allowed))

    def resolve(self, path: Path | str, field: str, *, origin: str, base: Path | None = None) -> Path:
        """The real path of `path` (relative ones are taken from `base`, default the repository), symbolic links
        followed. Does not block beyond the file system calls; does not need the file to exist (the caller says
        "not found" by name), so an outside path is refused whether or not it exists.

        Raises ModelConfigError naming `field` (with `origin`, "model 'x'") unless the real path is inside the
        repository or an allowed root: an absolute path, `..` steps or a symbolic link that lead elsewhere.
        """
        given = Path(path)
        candidate = given if given.is_absolute() else (base or self.repository) / given
        real = candidate.resolve()  # as the OS will open it: `..` after a link goes up from the link's target
        if self._root_of(real) is not None:
            return real
        lexical = Path(os.path.normpath(candidate))
        if self._root_of(lexical) is not None:
            # Inside by its name, outside in fact: say which link to look at, never where it leads.
            what = f"{field} '{self.shown(lexical)}' leads outside through a symbolic link: it"
        else:
            what = f"{field} '{given.as_posix()}'"  # the caller's own words (a request's, or config.pbtxt's)
        raise ModelConfigError(
            f"{origin}: {what} must be inside the model repository or a root allowed with {ALLOW_ROOT_FLAG}"
        )

    def shown(self, path: Path) -> str:
        """`path` as a client may read it: relative to the repository ("m/1/model.onnx"), or to an allowed root,
        named by its last folder ("shared/m/1/model.onnx"); elsewhere only its name. Never an absolute path."""
        root = self._root_of(path)
        if root is None:
            return path.name
        relative = path.relative_to(root).as_posix()
        if root == self.repository:
            return relative
        return root.name if relative == "." else f"{root.name}/{relative}"

    def hide(self, text: str) -> str:
        """`text` (an error from a library: ONNX Runtime, TensorRT, the OS) with the roots written relative as in
        `shown`, and the folders of any other absolute path removed (its name stays)."""
        for root in sorted((self.repository, *self.allowed), key=lambda r: len(str(r)), reverse=True):
            label = "" if root == self.repository else f"{root.name}/"
            text = text.replace(f"{root}{os.sep}", label)
        return hide_paths(text)

    def _root_of(self, path: Path) -> Path | None:
        for root in (self.repository, *self.allowed):
            if path == root or root in path.parents:
                return root
        return None


def hide_paths(text: str, roots: ModelRoots | None = None) -> str:
    """`text` without the folders of absolute paths: relative to the repository where `roots` knows it, the bare
    file name otherwise. For messages that quote a library's error to a client."""
    if roots is not None:
        return roots.hide(text)
    return _ABSOLUTE_FOLDERS.sub("", text)


def shown_path(path: Path, roots: ModelRoots | None) -> str:
    """`path` relative to the repository (ModelRoots.shown); its name alone for a spec read from no repository."""
    return roots.shown(path) if roots is not None else path.name


def _what_it_is(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))
    kind = next((word for test, word in kinds if test(mode)), "a block device" if stat.S_ISBLK(mode) else "special")
    return f"{kind}, not a regular file"


def check_regular_file(path: Path, origin: str, roots: ModelRoots | None) -> os.stat_result:
    """`path`'s status (symbolic links followed) when it is a regular file. Opens nothing: a FIFO would block the
    open until a writer comes, a device may do anything when opened. Raises ModelConfigError naming the file
    (relative to the repository) when it is missing, cannot be looked at, or is a folder, a FIFO, a socket or a
    device."""
    shown = shown_path(path, roots)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ModelConfigError(f"{origin}: {shown} not found") from None
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot read {shown}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ModelConfigError(f"{origin}: {shown} is {_what_it_is(info.st_mode)}")
    return info


def read_regular_file(path: Path, origin: str, roots: ModelRoots | None) -> bytes:
    """The bytes of `path`, opened only if it is a regular file (check_regular_file), and without blocking should it
    have been swapped for a FIFO since (O_NONBLOCK; what was opened is checked again). Raises ModelConfigError naming
    the file as check_regular_file does, or when reading fails (permission, I/O)."""
    check_regular_file(path, origin, roots)
    shown = shown_path(path, roots)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot read {shown}: {error.strerror}") from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise ModelConfigError(f"{origin}: {shown} is {_what_it_is(mode)}")
        chunks = []
        while chunk := os.read(descriptor, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot read {shown}: {error.strerror}") from None
    finally:
        os.close(descriptor)


def read_regular_text(path: Path, origin: str, roots: ModelRoots | None) -> str:
    """read_regular_file as UTF-8 text; bytes that are not UTF-8 raise ModelConfigError naming the file and where."""
    data = read_regular_file(path, origin, roots)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ModelConfigError(
            f"{origin}: {shown_path(path, roots)} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None


HASHED_FILE_BYTES = 1 << 20  # files up to this size are stamped by content too (model.py and its neighbours)
SKIPPED_FOLDERS = frozenset({"__pycache__"})  # written by the python worker's imports: never what a model reads


def files_stamp(
    version_dir: Path | None,
    model_file: Path | None,
    *,
    origin: str,
    roots: ModelRoots | None = None,
    skip: Iterable[Path] = (),
) -> str:
    """A digest of the files an engine reads for one version: every file under `version_dir` (a python model.py
    imports its neighbours; ONNX Runtime reads external data beside the model; TensorRT a plan or the ONNX it builds
    from), `__pycache__` folders and the folders in `skip` left out, plus `model_file` when it lies elsewhere
    (`default_model_filename`). Each file counts with its relative path, size, modification and change times
    (nanoseconds), inode and device, and for files up to HASHED_FILE_BYTES their content (SHA-256), so a rewrite
    in place within a coarse timestamp is seen too; a symbolic link to a folder counts by its target's name.
    Two reads give the same stamp only if no file was changed, added, removed or replaced in between: a reload
    compares them to decide whether the engine can stay (ModelSpec.session_key).

    Opens only regular files, without blocking. Raises ModelConfigError naming the first file that is a FIFO, a
    socket or a device (the engine would hang or worse on it), that cannot be looked at, or, with `roots`, that a
    symbolic link takes outside the repository and the allowed roots. Blocks for the stat calls and the hashing
    (about 1 ms for a typical python model)."""
    entries: list[tuple[object, ...]] = []
    skipped = frozenset(path.resolve() for path in skip)
    if version_dir is not None:
        _stamp_folder(version_dir, version_dir, skipped, entries, origin, roots)
    if model_file is not None and (version_dir is None or version_dir.resolve() not in model_file.resolve().parents):
        entries.append(_file_entry(model_file, model_file.name, origin, roots))
    return hashlib.sha256(repr(sorted(entries, key=repr)).encode()).hexdigest()


def _stamp_folder(
    top: Path,
    folder: Path,
    skipped: frozenset[Path],
    entries: list[tuple[object, ...]],
    origin: str,
    roots: ModelRoots | None,
) -> None:
    try:
        with os.scandir(folder) as listing:
            children = sorted(listing, key=lambda entry: entry.name)
    except OSError as error:
        raise ModelConfigError(f"{origin}: cannot list {shown_path(folder, roots)}: {error.strerror}") from None
    for child in children:
        path = Path(child.path)
        relative = path.relative_to(top).as_posix()
        if roots is not None:
            roots.resolve(path, "file", origin=origin)  # a link that leads outside is refused by its own name
        if child.is_symlink() and not os.path.exists(path):
            entries.append((relative, "dangling link", os.readlink(path)))  # nothing to read; seen if it changes
            continue
        try:
            is_folder = child.is_dir(follow_symlinks=True)
        except OSError:
            is_folder = False  # a dangling link: stamped (and refused) as a file below
        if is_folder:
            if child.name in SKIPPED_FOLDERS or path.resolve() in skipped:
                continue
            if child.is_symlink():  # counted by where it points; never followed (a loop would never end)
                entries.append((relative, "link", os.readlink(path)))
                continue
            _stamp_folder(top, path, skipped, entries, origin, roots)
        else:
            entries.append(_file_entry(path, relative, origin, roots))


def _file_entry(path: Path, relative: str, origin: str, roots: ModelRoots | None) -> tuple[object, ...]:
    info = check_regular_file(path, origin, roots)
    digest = ""
    if info.st_size <= HASHED_FILE_BYTES:
        digest = hashlib.sha256(read_regular_file(path, origin, roots)).hexdigest()
    return (relative, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev, digest)


# A python model's packed execution environment (config.pbtxt parameter EXECUTION_ENV_PATH), and the variable its
# path may start with, replaced by the model's folder, as Triton's python backend does (docs/python-models.md).
EXECUTION_ENV_PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_VARIABLE = "$$TRITON_MODEL_DIRECTORY"


def archive_stamp(written: str, directory: Path | None) -> str:
    """What a reload compares of the packed environment `written` (EXECUTION_ENV_PATH as config.pbtxt gives it)
    names for the model in `directory`: the archive's size, times, inode and device now; "" when it names none, a
    folder or nothing there. A model whose archive changed is a changed model (spec_from_config adds this to its
    files' stamp), so its next load starts workers on the new content, as Triton extracts again an archive whose
    time changed. Never raises; stats one path."""
    if not written or (MODEL_DIRECTORY_VARIABLE in written and directory is None):
        return ""
    try:
        info = os.stat(written.replace(MODEL_DIRECTORY_VARIABLE, str(directory), 1))
    except (OSError, ValueError):
        return ""
    if not stat.S_ISREG(info.st_mode):
        return ""
    return (
        f" {EXECUTION_ENV_PARAMETER} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino} {info.st_dev}"
    )
