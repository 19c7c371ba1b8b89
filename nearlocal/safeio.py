"""One policy for every file nearlocal reads or writes for the user, and for its own stdout.

- Output paths (`--json`, `--junit`, `--output`, `--html`, `--markdown`) are checked before
  anything is measured (`check_output`): a directory, a FIFO or device, a missing or unwritable
  directory, a name too long is one line and exit 2 while nothing is lost yet.
- Writing (`write_output`, `writing`) goes through a temporary file renamed into place; any
  OSError is one line naming the option, the path and the errno, plus what was kept
  (`note_kept`: the stored run, say).
- Inputs (`read_input`, `load_json`) are regular files only (a FIFO would block forever, /dev/zero
  never ends), at most MAX_INPUT_BYTES, nested at most MAX_DEPTH deep.
- stdout and stderr (`guarded_streams`): a stream that cannot encode a character (LANG=C, an ASCII
  CI log) gets an ASCII spelling of it; a full or failing stdout is one line; a closed stdout is
  refused before anything runs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from nearlocal.errors import UsageError

MAX_INPUT_BYTES = 64 * 2**20  # a spec, a model config, a benchmark file, a run.json
MAX_DEPTH = 64  # nesting of JSON / TOML values: every format nearlocal reads needs under 10

_kept: list[str] = []  # what a later failure leaves safe (said in its one line)


def note_kept(text: str) -> None:
    """Say what is already safe on disk: an error after this point names it."""
    _kept.append(text)


def kept_note() -> str:
    return "; ".join(_kept)


def reset_kept() -> None:
    _kept.clear()


def os_error_text(exc: OSError) -> str:
    """`No space left on device (ENOSPC)`."""
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} ({name})" if name else text


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def printable(value: object) -> str:
    """A path or value as text that every stream can print (undecodable bytes escaped)."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


# ---------------------------------------------------------------- output files


def check_output(option: str, text: str | os.PathLike | None) -> Path | None:
    """The path an option names, checked before anything is measured: a regular file (or a new
    name) in an existing, writable directory. /dev/null is allowed."""
    if text is None:
        return None
    shown = f"cannot write {option} {printable(text)}"
    if not str(text).strip():
        raise UsageError(f"cannot write {option}: the path is empty; give a file name")
    path = Path(text)
    if os.path.realpath(path) == os.devnull:
        return path
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise UsageError(f"{shown}: {os_error_text(exc)}") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{shown}: is a directory; give a file name")
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{shown}: is {_kind(info.st_mode)}, not a regular file")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent_info = os.stat(parent)
    except FileNotFoundError:
        raise UsageError(f"{shown}: directory {printable(parent)} does not exist") from None
    except OSError as exc:
        raise UsageError(f"{shown}: directory {printable(parent)}: {os_error_text(exc)}") from None
    if not stat.S_ISDIR(parent_info.st_mode):
        raise UsageError(f"{shown}: {printable(parent)} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{shown}: directory {printable(parent)} is not writable")
    if info is not None and not os.access(path, os.W_OK):
        raise UsageError(f"{shown}: the file is not writable")
    problem = name_problem(path)
    if problem:
        raise UsageError(f"{shown[:80]}: {problem}")
    probe = parent / f".nearlocal-probe-{os.getpid()}"  # what access() cannot tell: /proc, EROFS
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{shown}: directory {printable(parent)} takes no new file: "
                         f"{os_error_text(exc)}") from None
    return path


TEMP_SUFFIX_BYTES = 32  # the longest suffix nearlocal adds to a name for its temporary files


def name_problem(path: Path) -> str | None:
    """"the file name is too long ..." when `path`'s last part (plus a temporary suffix) is
    longer than its file system takes (ENAMETOOLONG at open), else None."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        name_max = os.pathconf(parent if parent.is_dir() else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    length = len(os.fsencode(path.name))
    if length + TEMP_SUFFIX_BYTES > name_max:
        return (f"the file name is {length} bytes, too long (ENAMETOOLONG: at most "
                f"{name_max - TEMP_SUFFIX_BYTES} here)")
    return None


@contextlib.contextmanager
def writing(option: str, path: str | os.PathLike, name_every_error: bool = False) \
        -> Iterator[None]:
    """Any OSError inside is one line: the option, the path (the file the error names, unless
    `name_every_error`: a temporary file is no name the user knows), the errno, what was kept."""
    try:
        yield
    except OSError as exc:
        where = exc.filename if exc.filename not in (None, "") and not name_every_error else path
        raise UsageError(_failure(f"cannot write {option} {printable(where)}", exc)) from None


def _failure(what: str, exc: OSError) -> str:
    kept = kept_note()
    return f"{what}: {os_error_text(exc)}" + (f"; {kept}" if kept else "")


def new_file_mode() -> int:
    """0666 less the umask: what open(2) would give a new file (mkstemp always gives 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """The one atomic writer (outputs, baselines and the store's files): a temporary file in the
    same directory, fsynced, renamed over `path`; removed again when anything fails."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, new_file_mode())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def write_output(option: str, path: str | os.PathLike, data: str | bytes) -> Path:
    """Write a whole file through a temporary one in the same directory: a full disk leaves the
    previous file (if any) whole and no half-written one."""
    path = Path(path)
    raw = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data
    with writing(option, path, name_every_error=True):
        if os.path.realpath(path) == os.devnull:
            with open(path, "wb") as handle:
                handle.write(raw)
            return path
        atomic_write_bytes(path, raw)
    return path


def write_outputs(option: str, files: dict[Path, bytes]) -> list[Path]:
    """Several files that belong together (a report and its plots), each written atomically, in
    order; when one fails, those this call already wrote are removed: a full disk leaves no
    half-written file and no plots without their report."""
    written: list[Path] = []
    try:
        for path, data in files.items():
            written.append(write_output(option, path, data))
    except BaseException:
        for path in written:
            if os.path.realpath(path) != os.devnull:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        raise
    return written


# ---------------------------------------------------------------- input files


def read_input(path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """A whole regular file of at most `limit` bytes, or one line naming `what` and the problem
    (a FIFO is refused without blocking on it; /dev/zero never ends, so devices are refused)."""
    shown = f"{what} {printable(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise UsageError(f"cannot read {shown}: no such file (ENOENT)") from None
    except OSError as exc:
        raise UsageError(f"cannot read {shown}: {os_error_text(exc)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{shown}: is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise UsageError(f"{shown}: is {info.st_size} bytes, more than the {limit} bytes "
                             "nearlocal reads")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise UsageError(f"{shown}: is more than the {limit} bytes nearlocal reads")
        return b"".join(chunks)
    except OSError as exc:
        raise UsageError(f"cannot read {shown}: {os_error_text(exc)}") from None
    finally:
        os.close(fd)


def depth_problem(value: object, limit: int = MAX_DEPTH) -> str | None:
    """"nested more than N deep" when `value` (parsed JSON / TOML) is, else None. Iterative: a
    deep value is what would overflow the stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return f"nested more than {limit} deep"
            stack.extend((child, depth + 1)
                         for child in (item.values() if isinstance(item, dict) else item))
    return None


class TooDeep(ValueError):
    """Parsed input nested deeper than MAX_DEPTH (or deep enough to overflow the parser)."""


def parse_nested(parse, text):
    """`parse(text)` (json.loads, tomllib.loads) with the nesting bounded: TooDeep past it."""
    try:
        value = parse(text)
    except RecursionError:
        raise TooDeep(f"nested more than {MAX_DEPTH} deep") from None
    problem = depth_problem(value)
    if problem:
        raise TooDeep(problem)
    return value


def load_json(path: str | os.PathLike, what: str, limit: int = MAX_INPUT_BYTES) -> object:
    """A bounded JSON file (read_input, parse_nested), or one line naming `what`."""
    raw = read_input(path, what, limit)
    try:
        return parse_nested(json.loads, raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{what} {printable(path)}: binary, not JSON text") from None
    except TooDeep as exc:
        raise UsageError(f"{what} {printable(path)}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} {printable(path)}: not JSON ({exc.msg}, line {exc.lineno})") \
            from None


# ---------------------------------------------------------------- stdout / stderr

_ASCII = {"\u2013": "-", "\u2014": "-", "\u2212": "-", "\u00b7": ".", "\u2022": "*",
          "\u00b5": "u", "\u03bc": "u", "\u00d7": "x", "\u2264": "<=", "\u2265": ">=",
          "\u2248": "~", "\u2192": "->", "\u2190": "<-", "\u2026": "...", "\u00b1": "+-",
          "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2713": "ok",
          "\u2717": "x", "\u00a0": " ", "\u2502": "|", "\u2500": "-"}
_TABLE = str.maketrans(_ASCII)


def degrade(text: str, encoding: str) -> str:
    """`text` as `encoding` can hold it: known symbols spelled in ASCII, anything else `?`."""
    return text.translate(_TABLE).encode(encoding, "replace").decode(encoding)


class StdoutError(UsageError):
    """stdout (or the file it is redirected to) refused a write: full disk, I/O error."""


class GuardedStream:
    """A text stream that never raises UnicodeEncodeError (it degrades to what the stream's
    encoding holds) and turns OSError into one line (StdoutError); the reader going away stays a
    BrokenPipeError (the command line exits 141 quietly)."""

    def __init__(self, stream, name: str, quiet: bool = False):
        self._stream, self._name, self._quiet = stream, name, quiet

    def __getattr__(self, attr):
        return getattr(self._stream, attr)

    def _failed(self, exc: OSError):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())  # exit's flush
        if self._quiet:
            return None
        raise StdoutError(_failure(f"cannot write to {self._name}", exc)) from None

    def write(self, text: str) -> int:
        try:
            try:
                return self._stream.write(text)
            except UnicodeEncodeError:
                return self._stream.write(degrade(text, self._stream.encoding or "ascii"))
        except BrokenPipeError:
            raise
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            self._failed(exc)


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def guarded_streams() -> Iterator[bool]:
    """stdout / stderr as GuardedStreams for the duration of one command; yields whether stdout
    was closed (the caller refuses to run: the results go there). A closed descriptor is taken
    by /dev/null, so that no file opened meanwhile becomes "stdout"."""
    saved = sys.stdout, sys.stderr
    if sys.stderr is None or _closed(sys.stderr, 2):
        _take_descriptor(2)
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    stdout_closed = sys.stdout is None or _closed(sys.stdout, 1)
    if stdout_closed:
        _take_descriptor(1)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    sys.stdout = GuardedStream(sys.stdout, "stdout")
    sys.stderr = GuardedStream(sys.stderr, "stderr", quiet=True)
    try:
        yield stdout_closed
    finally:
        sys.stdout, sys.stderr = saved


def _take_descriptor(fd: int) -> None:
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def _closed(stream, fd: int) -> bool:
    """The stream is the process's own descriptor `fd` and that descriptor is closed."""
    try:
        return stream.fileno() == fd and not _fd_open(fd)
    except (OSError, ValueError, AttributeError):
        return False  # a capture (pytest) or a stream without a descriptor: not closed


# ------------------------------------------------------------------ whose terminal
# (here, not in terminal.py, which loads rich: the command line asks before any command runs)


def owns_terminal(stream: IO[str]) -> bool:
    """Whether `stream` is a terminal someone reads: a tty that is this process's controlling
    terminal. An MPI launcher hands each rank a pseudo-terminal for stdout (Open MPI does) and
    copies it to wherever its own output goes, a file or a CI log: the rank's isatty() is true,
    but that pty is no terminal of the rank's session (tcgetpgrp fails on it). Rich would call it
    a terminal, as it would any stream under FORCE_COLOR or TTY_COMPATIBLE; colour codes and
    boxes would then land in the log. A stream with no descriptor is taken at its word."""
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):  # a test double: what its isatty() says
        return True
    try:
        os.tcgetpgrp(fd)
    except OSError:  # a tty, but not this session's terminal: a launcher's pty
        return False
    return True


def quiet_library_colours() -> None:
    """numba colours its error messages through colorama, whose exit handler writes a reset code
    to stdout whenever stdout is a tty, a launcher's pty included: under mpiexec every rank left
    one in the log. Off (before numba loads; workers inherit it) unless stdout is our terminal."""
    if not owns_terminal(sys.stdout):
        os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
