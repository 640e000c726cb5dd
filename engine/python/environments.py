"""Execution environments: a python model's workers may run on a Python environment of the model's own, named by
Triton's `EXECUTION_ENV_PATH` parameter, so a model pinned to numpy 1 serves beside one on the server's numpy 2
(docs/python-models.md, "Execution environments").

    declared_environment(spec)  the parameter read as Triton 2.51 reads it: `$$TRITON_MODEL_DIRECTORY` replaced by
                                the model's folder, a relative path taken from the server's working directory; the
                                path must exist and be a folder with bin/python3 (an environment) or a file (a packed
                                one). Writes nothing, runs nothing: `python -m service check` stops here. Raises
                                ModelConfigError naming the parameter.
    Environments.prepare        at the model's first worker: a packed environment (a tar archive, .tar.gz as
                                conda-pack makes it) is extracted once under --python-environments-dir, into a folder
                                named by the archive's SHA-256; the environment's interpreter is asked its Python and
                                numpy versions. Raises ModelLoadError naming the parameter and what is wrong.
    Launch                      what a worker starts with: the environment's bin/python3, and its variables
    (what a reload compares of the archive, its stamp, is the config reader's: engine/config/files.py archive_stamp;
    a load after the archive changed starts the workers again)

A worker of an environment runs `python -m engine.python.worker` on the environment's interpreter with the
project's root as PYTHONPATH: slotserve's worker modules (worker.py, transport.py, pipe.py, output.py,
triton_python_backend_utils.py, engine/datatypes.py, engine/errors.py) run on the environment's Python and numpy,
so they use only the standard library and what numpy 1.23 and 2.x both have; the pipe carries pickles of builtins
and of those modules' records, never numpy objects. Hence the refusals: an environment whose Python minor version
is not the server's (the worker's code and its pickles are the server's; Triton's stub must match the environment's
Python too), one without numpy 1.23 or newer.

Extraction is safe against archives made to write or point outside their folder (zip slip): a member named with
'..' or an absolute path, a member beneath a link (nothing is ever written through a link: each folder on a
member's way is checked to be a folder, files are created exclusively and without following a link), a hard link to
anything but a file extracted before it (it is copied), a symbolic link whose target, followed link by link with the
folder as the top, leaves the folder (an absolute target, a '..' above the top, a loop), devices and FIFOs. Each is
refused naming the member, and the half-extracted folder is removed. An archive is extracted into a private
`.partial-<pid>-*` folder and renamed into place, so a folder named by a digest is complete, two loads of one
archive (two models, two servers sharing the folder) never mix, and what a killed server left half-done is removed
by the next extraction.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

from ..config.specs import ModelSpec
from ..errors import ModelConfigError, ModelLoadError

_LOG = logging.getLogger(__name__)

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"  # replaced by the model's folder, as Triton's python backend does
FLAG = "--python-environments-dir"
DEFAULT_FOLDER_NAME = "slotserve-python-environments"
INTERPRETERS = ("python3", "python")  # looked for in the environment's bin/, in this order
MIN_NUMPY = (1, 23)  # the oldest numpy the worker's modules are kept to (np.fromiter of objects: 1.23)
PROBE_SECONDS = 120.0  # asking the interpreter its versions imports numpy: slow on a cold disk, never unbounded
MAX_LINK_HOPS = 40  # as the kernel's bound on links followed in one path: more is a loop
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
_PARTIAL = re.compile(r"\.partial-(\d+)-")

# Printed by the environment's interpreter: its Python version and numpy's (or why numpy does not import).
_PROBE = """
import json, sys
try:
    import numpy
    version, problem = numpy.__version__, None
except Exception as error:
    version, problem = None, f"{type(error).__name__}: {error}"
print(json.dumps({"python": list(sys.version_info[:2]), "numpy": version, "problem": problem}))
"""


class EnvironmentKind(Enum):
    FOLDER = "folder"  # an environment as it is: bin/python3 runs the workers
    PACKED = "packed"  # an archive of one: extracted once (Environments.prepare), then used as a folder


@dataclass(frozen=True)
class DeclaredEnvironment:
    """A model's EXECUTION_ENV_PATH, read and checked (declared_environment)."""

    model: str
    written: str  # as config.pbtxt gives it
    path: Path  # resolved: links followed, absolute
    kind: EnvironmentKind

    def problem(self, text: str) -> str:
        """A message naming the model, the parameter and `text` (what is wrong with it)."""
        return f"model '{self.model}': {PARAMETER} '{self.written}' {text}"


@dataclass(frozen=True)
class Launch:
    """How a model's worker process starts: the interpreter that runs `-m engine.python.worker`, and the
    environment variables it gets."""

    executable: str
    variables: Mapping[str, str]


class Launcher(Protocol):
    def launch(self) -> Launch:
        """How to start a worker (its interpreter and environment). Blocks while an environment
        is prepared; raises ModelLoadError."""


class ServerLauncher:
    """Workers on the server's own interpreter and packages (a model without EXECUTION_ENV_PATH)."""

    def launch(self) -> Launch:
        """The server's own interpreter, with the project on PYTHONPATH. Never blocks."""
        variables = dict(os.environ)
        variables["PYTHONPATH"] = os.pathsep.join(filter(None, [PROJECT_ROOT, variables.get("PYTHONPATH")]))
        variables["PYTHONUNBUFFERED"] = "1"  # what the model prints reaches the log as it prints it
        return Launch(sys.executable, variables)


SERVER = ServerLauncher()


class EnvironmentLauncher:
    """Workers on a model's own environment: prepared (extracted, asked its versions) at the first launch, the
    same Launch for every later worker of the model. Two first launches at once both prepare (the same result);
    `_lock` guards `_launch` only, never held while preparing."""

    def __init__(self, environments: Environments, declared: DeclaredEnvironment) -> None:
        self._environments = environments
        self._declared = declared
        self._lock = threading.Lock()  # guards: _launch
        self._launch: Launch | None = None

    def launch(self) -> Launch:
        """Blocks for the preparation at the first call (an extraction: as long as the archive takes). Raises
        ModelLoadError naming what is wrong with the environment."""
        with self._lock:
            launch = self._launch
        if launch is None:
            launch = self._environments.prepare(self._declared)
            with self._lock:
                self._launch = launch
        return launch


def default_folder() -> Path:
    """<the system temporary folder>/slotserve-python-environments, found without touching the disk
    (tempfile.gettempdir() writes probe files, and fails on a read-only root)."""
    if tempfile.tempdir is not None:
        return Path(tempfile.tempdir) / DEFAULT_FOLDER_NAME
    for variable in ("TMPDIR", "TEMP", "TMP"):
        if os.environ.get(variable):
            return Path(os.environ[variable]) / DEFAULT_FOLDER_NAME
    return Path("/tmp") / DEFAULT_FOLDER_NAME


def interpreter_of(folder: Path) -> Path | None:
    """The environment's bin/python3 (else bin/python) when it is an executable file; None when there is none."""
    for name in INTERPRETERS:
        candidate = folder / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def declared_environment(spec: ModelSpec) -> DeclaredEnvironment | None:
    """The model's EXECUTION_ENV_PATH, checked without writing or running anything; None when it names none (the
    parameter absent or empty, as Triton). Raises ModelConfigError when the path does not exist, cannot be
    looked at, is a folder without bin/python3, or is neither a folder nor a file."""
    written = spec.parameter(PARAMETER)
    if not written:
        return None
    origin = f"model '{spec.name}': {PARAMETER} '{written}'"
    value = written
    if MODEL_DIRECTORY in written:
        if spec.directory is None:
            raise ModelConfigError(f"{origin} names {MODEL_DIRECTORY}, and the model has no folder")
        value = written.replace(MODEL_DIRECTORY, str(spec.directory), 1)
    path = Path(value)  # relative: from the server's working directory, as Triton's realpath() takes it
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ModelConfigError(f"{origin} does not exist") from None
    except OSError as error:
        raise ModelConfigError(f"{origin} cannot be looked at: {error.strerror or error}") from None
    resolved = Path(os.path.realpath(path))
    if stat.S_ISDIR(info.st_mode):
        if interpreter_of(resolved) is None:
            raise ModelConfigError(
                f"{origin} is a folder that has no bin/python3: an environment is a folder with its "
                "interpreter there (a venv, a conda environment, an unpacked conda-pack archive)"
            )
        return DeclaredEnvironment(spec.name, written, resolved, EnvironmentKind.FOLDER)
    if stat.S_ISREG(info.st_mode):
        return DeclaredEnvironment(spec.name, written, resolved, EnvironmentKind.PACKED)
    raise ModelConfigError(f"{origin} is neither a folder (an environment) nor a file (a packed environment)")


class Environments:
    """The server's execution environments: packed ones are extracted under `folder` (--python-environments-dir;
    made at the first extraction, so nothing is written before one), one sub-folder per archive content, kept
    across loads and restarts (the archive's SHA-256 names it). Thread-safe; `_lock` guards `_digests` only, never
    held across hashing, extracting or probing."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_folder()
        self._lock = threading.Lock()  # guards: _digests
        self._digests: dict[
            tuple[object, ...], str
        ] = {}  # an archive's identity (path, inode, size, mtime) -> its SHA-256

    def launcher(self, declared: DeclaredEnvironment) -> EnvironmentLauncher:
        """A launcher for `declared` that prepares its environment at the first worker it starts (nothing is done
        now)."""
        return EnvironmentLauncher(self, declared)

    def prepare(self, declared: DeclaredEnvironment) -> Launch:
        """The Launch of a worker on `declared`'s environment: extracted first when it is packed, its interpreter
        asked its Python and numpy versions. Blocks for both. Raises ModelLoadError naming the parameter and the
        problem (an archive that does not extract or is unsafe, no interpreter, another Python, no numpy)."""
        folder = declared.path if declared.kind is EnvironmentKind.FOLDER else self._extracted(declared)
        python = interpreter_of(folder)
        if python is None:
            where = "its archive's top" if declared.kind is EnvironmentKind.PACKED else "the folder"
            raise ModelLoadError(
                declared.problem(
                    f"has no bin/python3 at {where}: an environment is a folder with its interpreter there (a "
                    "venv, a conda environment; a packed one as conda-pack makes it, its folders at the top)"
                )
            )
        launch = Launch(str(python), environment_variables(folder))
        versions = check(declared, launch)
        _LOG.info("model '%s': python execution environment %s (%s)", declared.model, folder, versions)
        return launch

    # ---- packed environments -------------------------------------------------------------------------------------

    def _extracted(self, declared: DeclaredEnvironment) -> Path:
        """The folder the archive is extracted in, extracting it when no folder of its content is there yet. The
        archive is read from one open file: the content hashed is the content extracted."""
        known = self._known_digest(declared)
        if known is not None and (self.folder / known).is_dir():
            return self.folder / known  # no read at all: a later load, another model naming the same archive
        try:
            handle = _open_regular(declared.path)
        except OSError as error:
            raise ModelLoadError(declared.problem(f"cannot be read: {error.strerror or error}")) from None
        with handle:
            digest = self._digest(declared, handle)
            target = self.folder / digest
            if target.is_dir():
                return target  # extracted by an earlier server (or another thread), or the file was replaced
            handle.seek(0)
            self._extract(declared, handle, target)
        return target

    def _extract(self, declared: DeclaredEnvironment, handle: IO[bytes], target: Path) -> None:
        """Extract the open archive into a private folder and rename it to `target`. Raises ModelLoadError."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._remove_abandoned()
            partial = Path(tempfile.mkdtemp(prefix=f".partial-{os.getpid()}-", dir=self.folder))
        except OSError as error:
            raise ModelLoadError(self._unwritable(declared, error)) from None
        started = time.monotonic()
        try:
            extract_archive(handle, partial)
            _publish(partial, target)
        except UnsafeArchive as error:
            raise ModelLoadError(declared.problem(f"is refused: {error}")) from None
        except (tarfile.TarError, EOFError, zlib.error) as error:
            raise ModelLoadError(declared.problem(f"is not an archive that extracts ({_said(error)})")) from None
        except OSError as error:
            if error.errno is None:  # gzip's and bz2's word for a corrupt stream
                raise ModelLoadError(declared.problem(f"is not an archive that extracts ({_said(error)})")) from None
            raise ModelLoadError(self._unwritable(declared, error)) from None
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # gone already when published
        _LOG.info(
            "model '%s': extracted %s '%s' into %s in %.1f s",
            declared.model,
            PARAMETER,
            declared.written,
            target,
            time.monotonic() - started,
        )

    def _unwritable(self, declared: DeclaredEnvironment, error: OSError) -> str:
        return declared.problem(
            f"is packed and cannot be extracted under {FLAG} {self.folder}: {error.strerror or error} (give it "
            "a writable folder: on a read-only root filesystem, a mounted volume)"
        )

    def _known_digest(self, declared: DeclaredEnvironment) -> str | None:
        """The SHA-256 this server computed for the archive as it is now (its path, inode, size, mtime); None."""
        try:
            info = os.stat(declared.path)
        except OSError:
            return None
        with self._lock:
            return self._digests.get(_identity(declared.path, info))

    def _digest(self, declared: DeclaredEnvironment, handle: IO[bytes]) -> str:
        """The SHA-256 (hex) of the open archive, remembered for its identity. Raises ModelLoadError."""
        digest = hashlib.sha256()
        try:
            info = os.fstat(handle.fileno())
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        except OSError as error:
            raise ModelLoadError(declared.problem(f"cannot be read: {error.strerror or error}")) from None
        with self._lock:
            self._digests[_identity(declared.path, info)] = digest.hexdigest()
        return digest.hexdigest()

    def _remove_abandoned(self) -> None:
        """Remove the half-extracted folders of processes that are gone (a server killed while extracting)."""
        for entry in self.folder.iterdir():
            match = _PARTIAL.match(entry.name)
            if match is not None and not _alive(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)


def _identity(path: Path, info: os.stat_result) -> tuple[object, ...]:
    return (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _open_regular(path: Path) -> IO[bytes]:
    """`path` open for reading when it is a regular file. Opens without blocking (a FIFO put in the archive's
    place since the load checked it would block an open) and raises OSError (EINVAL) for anything else."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, "not a regular file")
    return os.fdopen(descriptor, "rb")


def _publish(partial: Path, target: Path) -> None:
    """Rename the extracted folder into place; when another extraction of the same archive got there first, its
    folder is the same content and ours is dropped (by the caller)."""
    try:
        os.rename(partial, target)
    except OSError:
        if not target.is_dir():
            raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _said(error: BaseException) -> str:
    """The error's text on one line (tarfile's lists each method it tried on a line of its own)."""
    return " ".join(str(error).split()) or type(error).__name__


def environment_variables(folder: Path) -> dict[str, str]:
    """The variables of a worker on the environment `folder`: the server's, with what activating the environment
    sets (its bin/ first on PATH, VIRTUAL_ENV; its lib/ first on LD_LIBRARY_PATH, as Triton's python backend sets
    it for the environment's libpython), the project's root alone as PYTHONPATH (the server's may name its own
    packages, numpy 2 among them), no PYTHONHOME (the server's interpreter's), and no user site-packages (another
    numpy may be there: Triton's README asks for PYTHONNOUSERSITE when packing for the same reason)."""
    variables = dict(os.environ)
    variables.pop("PYTHONHOME", None)
    variables["PYTHONPATH"] = PROJECT_ROOT
    variables["PYTHONNOUSERSITE"] = "1"
    variables["PYTHONUNBUFFERED"] = "1"
    variables["VIRTUAL_ENV"] = str(folder)
    variables["PATH"] = os.pathsep.join(filter(None, [str(folder / "bin"), os.environ.get("PATH")]))
    variables["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(folder / "lib"), os.environ.get("LD_LIBRARY_PATH")])
    )
    return variables


def check(declared: DeclaredEnvironment, launch: Launch) -> str:
    """Ask the environment's interpreter its Python and numpy versions (run as a worker runs, in at most
    PROBE_SECONDS). Returns them in words. Raises ModelLoadError when it does not answer, runs another Python minor
    version than the server's, or has no numpy 1.23 or newer."""
    python, numpy_version, numpy_problem = _ask(declared, launch)
    server = sys.version_info[:2]
    if python != server:
        raise ModelLoadError(
            declared.problem(
                f"is an environment of Python {'.'.join(map(str, python))}; the server runs Python "
                f"{server[0]}.{server[1]}: the model's workers run slotserve's own code on the environment's "
                "interpreter, so its minor version must be the server's (as Triton's stub must match it)"
            )
        )
    if numpy_version is None:
        raise ModelLoadError(
            declared.problem(f"has no numpy ({numpy_problem}): a worker needs numpy 1.23 or newer in its environment")
        )
    if _release(numpy_version) < MIN_NUMPY:
        raise ModelLoadError(
            declared.problem(f"has numpy {numpy_version}: a worker needs numpy 1.23 or newer in its environment")
        )
    return f"Python {python[0]}.{python[1]}, numpy {numpy_version}"


def _ask(declared: DeclaredEnvironment, launch: Launch) -> tuple[tuple[int, ...], str | None, str | None]:
    """(Python's major and minor version, numpy's version or None, why numpy did not import) from the probe."""
    try:
        ran = subprocess.run(
            [launch.executable, "-c", _PROBE],
            env=dict(launch.variables),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise ModelLoadError(
            declared.problem(f"has an interpreter that did not answer within {PROBE_SECONDS:g} s")
        ) from None
    except OSError as error:
        raise ModelLoadError(
            declared.problem(f"has an interpreter that does not run ({launch.executable}): {error.strerror or error}")
        ) from None
    try:
        answer = json.loads(ran.stdout.strip().splitlines()[-1])
        return tuple(int(part) for part in answer["python"]), answer["numpy"], answer["problem"]
    except (ValueError, IndexError, KeyError, TypeError):
        said = ran.stderr.strip()[-500:] or f"it exited with status {ran.returncode}"
        raise ModelLoadError(
            declared.problem(f"has an interpreter that did not answer as a Python does ({launch.executable}): {said}")
        ) from None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


# ---- safe extraction ------------------------------------------------------------------------------------------


class UnsafeArchive(ValueError):
    """An archive member that would be written, or would point, outside the environment's folder, or that an
    environment cannot hold (a device, a FIFO, a name twice)."""


def extract_archive(archive: Path | IO[bytes], destination: Path) -> None:
    """Extract the tar archive `archive` (a path or a file open for reading, its content gzip, bzip2, xz or
    plain) into the empty folder `destination`, refusing
    whatever could write or point outside it (the module's docstring). Files keep their modification times (a
    conda environment's .pyc files are checked against them) and their executable bits, nothing else of their
    modes (no setuid, no write for others); no ownership is applied. Blocks for the whole archive. Raises
    UnsafeArchive naming the member; tarfile.TarError, EOFError, zlib.error or OSError when the archive cannot be
    read or the folder written (what was extracted so far is left for the caller to remove)."""
    folders: set[PurePosixPath] = {PurePosixPath()}  # made here: real folders, never links
    files: set[PurePosixPath] = set()  # regular files written here (what a hard link may copy)
    links: list[PurePosixPath] = []
    opened = tarfile.open(archive, "r:*") if isinstance(archive, Path) else tarfile.open(fileobj=archive, mode="r:*")
    with opened as tar:
        for member in tar:
            name = _member_name(member.name, "member")
            if name is None:  # the archive's top folder itself ("." or "./")
                continue
            _make_parents(destination, name, folders)
            path = destination.joinpath(*name.parts)
            if member.isdir():
                _make_folder(path, name)
                folders.add(name)
            elif member.isreg():
                _write_file(path, name, tar.extractfile(member), member)
                files.add(name)
            elif member.issym():
                if PurePosixPath(member.linkname).is_absolute():
                    raise UnsafeArchive(f"link '{name}' -> '{member.linkname}' leads out of the environment")
                with _only_once(name):
                    os.symlink(member.linkname, path)
                links.append(name)
            elif member.islnk():
                source = _member_name(member.linkname, "hard link target")
                if source is None or source not in files:
                    raise UnsafeArchive(f"hard link '{name}' -> '{member.linkname}' names no file extracted before it")
                with open(destination.joinpath(*source.parts), "rb") as original:
                    _write_file(path, name, original, member)
                files.add(name)
            else:
                raise UnsafeArchive(
                    f"member '{member.name}' is a {_kind(member)}: an environment holds files, folders and links"
                )
    for name in links:
        if not _stays_inside(destination, name):
            raise UnsafeArchive(
                f"link '{name}' -> '{os.readlink(destination.joinpath(*name.parts))}' leads out of the environment"
            )


def _member_name(raw: str, what: str) -> PurePosixPath | None:
    """A member's name as a path under the folder; None for the folder itself. Raises UnsafeArchive for an
    absolute name or one with '..' (libarchive's words, which Triton's later releases report for them)."""
    path = PurePosixPath(raw)
    if "\x00" in raw:
        raise UnsafeArchive(f"{what} '{raw!r}' has a NUL in its name")
    if path.is_absolute():
        raise UnsafeArchive(f"{what} '{raw}' would be written outside the environment (Path is absolute)")
    if ".." in path.parts:
        raise UnsafeArchive(f"{what} '{raw}' would be written outside the environment (Path contains '..')")
    return path if path.parts else None


def _make_parents(destination: Path, name: PurePosixPath, folders: set[PurePosixPath]) -> None:
    """Make the folders on `name`'s way that are not there yet; each that is there must be a folder made here:
    a member beneath a link (or a file) is refused, so nothing is written through a link."""
    for depth in range(1, len(name.parts)):
        step = PurePosixPath(*name.parts[:depth])
        if step in folders:
            continue
        path = destination.joinpath(*step.parts)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            raise UnsafeArchive(
                f"member '{name}' lies beneath '{step}', which is not a folder (nothing is written through a link)"
            ) from None
        folders.add(step)


def _make_folder(path: Path, name: PurePosixPath) -> None:
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise UnsafeArchive(f"member '{name}' is in the archive twice, as a folder and as something else") from None


@contextlib.contextmanager
def _only_once(name: PurePosixPath) -> Iterator[None]:
    """Around the creation of `name`: an entry already there (the archive names it twice) is refused."""
    try:
        yield
    except FileExistsError:
        raise UnsafeArchive(f"member '{name}' is in the archive twice") from None


def _write_file(path: Path, name: PurePosixPath, source: IO[bytes] | None, member: tarfile.TarInfo) -> None:
    """Create `path` (never through a link, never over an entry: O_EXCL | O_NOFOLLOW) with `source`'s bytes."""
    mode = 0o755 if member.mode & 0o111 else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with _only_once(name):
        descriptor = os.open(path, flags, mode)
    with os.fdopen(descriptor, "wb") as target:
        if source is not None:
            shutil.copyfileobj(source, target, 1 << 20)
    os.chmod(path, mode, follow_symlinks=False)  # the umask may have taken bits the archive gives
    with contextlib.suppress(OverflowError, ValueError):
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


def _stays_inside(root: Path, link: PurePosixPath) -> bool:
    """Whether following the link `link` (a path under `root`) ends under `root`, every link on the way followed
    as the kernel follows it, with `root` as the top: an absolute target, a '..' above the top or more than
    MAX_LINK_HOPS links is out. A name that does not exist ends the links (nothing beneath it can be one)."""
    resolved: list[str] = list(link.parent.parts)  # folders made by the extraction: real ones
    pending: deque[str] = deque(PurePosixPath(os.readlink(root.joinpath(*link.parts))).parts)
    hops = 1
    while pending:
        part = pending.popleft()
        if part == "/":
            return False
        if part == "..":
            if not resolved:
                return False
            resolved.pop()
            continue
        here = root.joinpath(*resolved, part)
        try:
            info = os.lstat(here)
        except FileNotFoundError:
            resolved.append(part)
            continue
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > MAX_LINK_HOPS:
                return False
            pending.extendleft(reversed(PurePosixPath(os.readlink(here)).parts))
            continue
        resolved.append(part)
    return True


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.isfifo():
        return "FIFO"
    return f"entry of type {member.type!r}"
