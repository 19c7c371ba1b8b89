"""RPC over shared-memory slots: a ring of request / response slots polled in user space
(Beluga's metadata RPC, B15), with the visibility protocol a non-coherent pool needs.

Layout (64-bit words, every line written by one agent only, as a non-coherent pool requires):

    line 0   client: magic, slots, message words, protocol, stop
    line 1   server: ready (its pid), requests served, bad requests seen
    slot i   at 128 + i * slot_bytes:
             request flag line | request payload lines | response flag line | response payload lines

Request k (k = 0, 1, ...) goes to slot k % slots with sequence k + 1: the client writes the payload
and then publishes the sequence in the request flag; the server, taking requests in ring order,
waits for that sequence, reads the payload, writes the response and publishes the same sequence
in the response flag. Payloads are derived from the sequence, so both sides check every byte.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.rpc.kernels.slots import (
    HEADER_WORDS,
    MAGIC,
    STOPPED,
    TIMEOUT,
    W_BAD,
    W_MAGIC,
    W_MSG,
    W_PROTOCOL,
    W_READY,
    W_SERVED,
    W_SLOTS,
    W_STOP,
    serve,
)
from nearlocal.rpc.kernels.sync import WORDS_PER_LINE, flush_written, publish_flag, read_flag
from nearlocal.rpc.protocols import protocol_code

MAX_MESSAGE_BYTES = 4096


def layout(slots: int, message_bytes: int) -> tuple[int, int, int]:
    """(message words, words per slot, ring bytes) for a ring of `slots` slots."""
    if slots < 1:
        raise UsageError(f"an RPC ring needs at least one slot, got {slots}")
    if message_bytes <= 0 or message_bytes % 8 or message_bytes > MAX_MESSAGE_BYTES:
        raise UsageError(f"RPC message size {message_bytes} B is not valid: use a multiple of "
                         f"8 bytes from 8 to {MAX_MESSAGE_BYTES}")
    msg_words = message_bytes // 8
    half = WORDS_PER_LINE + (msg_words + WORDS_PER_LINE - 1) // WORDS_PER_LINE * WORDS_PER_LINE
    slot_words = 2 * half
    return msg_words, slot_words, (HEADER_WORDS + slots * slot_words) * 8


def payload_offsets(slots: int, message_bytes: int) -> np.ndarray:
    """Byte offsets of every request and response payload (the `rpc:` pattern's fragments)."""
    _, slot_words, _ = layout(slots, message_bytes)
    half = slot_words // 2
    starts = HEADER_WORDS + np.arange(slots, dtype=np.int64) * slot_words
    return np.stack([starts + WORDS_PER_LINE, starts + half + WORDS_PER_LINE], axis=1).ravel() * 8


def init_ring(raw: np.ndarray, slots: int, message_bytes: int, protocol: str) -> np.ndarray:
    """Zero the ring and write the client's header line; returns the word view.

    The zeroing and the header are cached stores: under `flush` they are written back before the
    magic word is published (the server checks the magic before it reads anything else)."""
    msg_words, _, ring_bytes = layout(slots, message_bytes)
    if raw.size < ring_bytes:
        raise UsageError(f"an RPC ring of {slots} slots of {message_bytes} B needs {ring_bytes} "
                         f"bytes, the region has {raw.size}")
    if raw.ctypes.data % 64:
        raise ValueError("the ring must start on a cache line")
    raw = raw[:ring_bytes]
    raw[:] = 0
    words = raw.view(np.uint64)
    code = protocol_code(protocol)
    words[W_SLOTS], words[W_MSG] = slots, msg_words
    words[W_PROTOCOL] = code
    flush_written(raw, 0, words.size, code)
    publish_flag(words, W_MAGIC, np.uint64(MAGIC), code)
    return words


def describe_error(status: int, timeout_s: float) -> str:
    if status == TIMEOUT:
        return f"the RPC server did not answer within {timeout_s:g} s"
    return "an RPC response carried the wrong bytes"


# --- the server process ------------------------------------------------------------------------

def set_parent_death_signal() -> None:
    """Ask the kernel to SIGKILL us when the client process dies: no orphaned spinners."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def load_server_kernel() -> None:
    """Load (from numba's cache, else compile) the server's kernel in this process: ~0.35 s that
    a server forked from here then does not pay. Serves an empty ring whose stop word is set."""
    words = np.zeros(HEADER_WORDS + 64, np.uint64)
    words[W_STOP] = 1
    raw = words.view(np.uint8)
    serve(raw, raw.view(np.uint64), 1, 8, protocol_code("coherent"), 0, np.uint64(1), 1)


def server_main(config: dict, client_gone: Callable[[], bool] | None = None) -> int:
    """Map the same bytes as the client, answer requests until told to stop or the client is
    gone: `client_gone` says so (default: this process's parent is no longer the client)."""
    from nearlocal.rpc.shared import attach

    set_parent_death_signal()
    parent = config["parent"]
    if client_gone is None:
        def client_gone() -> bool:
            return os.getppid() != parent
    if client_gone():
        return 1
    if config.get("cpu") is not None:
        os.sched_setaffinity(0, {config["cpu"]})
    slots, message_bytes = config["slots"], config["message_bytes"]
    msg_words, _, ring_bytes = layout(slots, message_bytes)
    raw, mapping = attach(config["handle"], ring_bytes)
    words = raw.view(np.uint64)
    protocol = protocol_code(config["protocol"])
    idle_ticks = np.uint64(config["tsc_hz"] * 0.2)
    if read_flag(raw, words, W_MAGIC, protocol) != MAGIC or words[W_SLOTS] != slots:
        return 1
    serve(raw, words, slots, msg_words, protocol, 0, np.uint64(1), 1)  # compile before ready
    publish_flag(words, W_READY, np.uint64(os.getpid()), protocol)
    k = 0
    try:
        while True:
            k, why = serve(raw, words, slots, msg_words, protocol, k, idle_ticks, 0)
            if why == STOPPED or client_gone():
                break
        publish_flag(words, W_SERVED, np.uint64(k), protocol)
    finally:
        del raw, words
        mapping.close()
    return 0


class _Forked:
    """A child forked by os.fork, with the part of Popen's interface ServerProcess uses."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"server {self.pid}", timeout)
            time.sleep(0.002)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _fork_server(config: dict, stderr) -> _Forked:
    """The server forked from this process: its kernels and libraries are loaded already, so it
    is ready in milliseconds, where a new interpreter took ~2 s per case per process (the rpc
    suite's 10 cases x 8 processes). The child never returns into the caller's code."""
    pid = os.fork()
    if pid:
        return _Forked(pid)
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the worker's unwinding handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client stops it, as a spawned one
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(stderr.fileno(), 2)
        code = server_main(config)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


class _Launched:
    """A server forked by multiprocessing's fork server, with the part of Popen's interface
    ServerProcess uses."""

    def __init__(self, process) -> None:
        self.process, self.pid = process, process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"server {self.pid}", timeout)
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()


def _start_time(pid: int) -> str | None:
    """When process `pid` started (/proc/PID/stat's starttime), None when it is gone: with its
    pid, what tells that process from a later one given the same pid."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def watch_process(pid: int) -> Callable[[], bool] | None:
    """A check that process `pid` (not our child) has exited, or None when it is gone already:
    a pidfd, readable once it exits (Linux >= 5.3); else, on older kernels (RHEL 8's 4.18),
    its start time read again, which a later process given the same pid does not share."""
    import select

    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError:  # ENOSYS: no pidfd_open before Linux 5.3
        started = _start_time(pid)
        if started is None:
            return None
        return lambda: _start_time(pid) != started
    return lambda: bool(select.select([handle], [], [], 0)[0])


def _launched_main(config: dict, stderr_path: str) -> None:
    """The server in a child of the fork server. Its parent is the fork server, which outlives
    the client while any child of it runs, so the server watches the client itself."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client stops it
    os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_APPEND), 2)
    client_gone = watch_process(config["parent"])
    os._exit(1 if client_gone is None else server_main(config, client_gone))


def _launch_server(config: dict, stderr_path: str) -> _Launched:
    """The server forked from this process's multiprocessing fork server, a new interpreter
    started once (fork+exec, as subprocess does), which never ran MPI: an MPI rank must not fork
    itself, and a new interpreter per server took ~0.6 s (the rack suite's RPC cases start one
    per client per case). The engine's server, where its workers started it first, preloads the
    method modules (a preload asked for once it runs is ignored); else rpc/server_preload.py."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["nearlocal.rpc.server_preload"])
    process = context.Process(target=_launched_main, args=(config, stderr_path), daemon=True)
    process.start()
    return _Launched(process)


class ServerProcess:
    """The server in its own process, pinned to its own CPU: forked from this one (`fork`,
    what the rpc methods' workers do: ready at once), or from multiprocessing's fork server (an
    MPI rank, which must not fork). Always stopped by `stop()`: stop word, then SIGKILL."""

    def __init__(self, handle: dict, words: np.ndarray, raw: np.ndarray, slots: int,
                 message_bytes: int, protocol: str, cpu: int | None, tsc_hz: float,
                 start_timeout_s: float = 120.0, fork: bool = False):
        self.words, self.raw = words, raw
        self.protocol = protocol_code(protocol)
        config = {"handle": handle, "slots": slots, "message_bytes": message_bytes,
                  "protocol": protocol, "cpu": cpu, "tsc_hz": tsc_hz, "parent": os.getpid()}
        # a file, not a pipe: a full pipe would block the server; closed (removed) in stop()
        self.stderr = tempfile.NamedTemporaryFile(prefix="nearlocal-rpc-server-")  # noqa: SIM115
        if fork:
            self.process = _fork_server(config, self.stderr)
        else:
            self.process = _launch_server(config, self.stderr.name)
        deadline = time.monotonic() + start_timeout_s
        while read_flag(raw, words, W_READY, self.protocol) != self.process.pid:
            if self.process.poll() is not None:
                self.stderr.seek(0)
                detail = self.stderr.read().decode(errors="replace").strip()
                self.process = None
                self.stderr.close()
                raise RuntimeError(f"the RPC server exited at start: {detail[-300:] or 'no output'}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the RPC server did not start within {start_timeout_s:g} s")
            time.sleep(0.005)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        publish_flag(self.words, W_STOP, np.uint64(1), self.protocol)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self.stderr.close()

    def bad_requests(self) -> int:
        return int(read_flag(self.raw, self.words, W_BAD, self.protocol))
