"""Issue 39 without a device: the work-request split by max_sge for each pattern, the chain the
timed loop posts, the compiled loop's calls through function pointers (ctypes callbacks stand in
for the provider), the struct layouts against verbs.h, probe's reasons on fake sysfs trees, the
rows' facts and bad input (one line, exit 2)."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from nearlocal.core.methods import load_methods
from nearlocal.core.patterns import parse_pattern
from nearlocal.errors import UsageError
from nearlocal.probe import verbs
from nearlocal.probe.rdma import gid_index, probe_rdma
from nearlocal.rdma.requests import build_chain, plan_requests, sge_limit
from nearlocal.sysroot import SysRoot

load_methods()  # the pattern kinds (kv:) register with their methods
CX7 = {"max_sge": 30, "max_sge_rd": 30, "max_qp_wr": 32768, "max_mr_size": 1 << 40}


@pytest.mark.parametrize(("pattern", "variant", "limits", "want"), [
    ("16KiB", "one", CX7, 1), ("16KiB", "batched", CX7, 1),
    ("128x20KiB", "one", CX7, 128), ("128x20KiB", "batched", CX7, 5),  # B2: 128 pieces, 30 SGEs
    ("1024x160B", "one", CX7, 1024), ("1024x160B", "batched", CX7, 35),
    ("1024x160B", "batched", {"max_sge": 32}, 32),  # soft-RoCE's limit
    ("kv:qwen2.5-32b:flash-attn:dense", "one", CX7, None),
])
def test_requests_split_by_max_sge(pattern, variant, limits, want):
    parsed = parse_pattern(pattern)
    plan = plan_requests(parsed.frags, sge_limit(variant, limits, verbs.WR_RDMA_WRITE))
    assert len(plan) == (want if want is not None else parsed.count)
    assert plan[:, 1].sum() == parsed.count and plan[:, 3].sum() == parsed.total_bytes
    assert plan[:, 1].max() <= sge_limit(variant, limits, verbs.WR_RDMA_WRITE)
    # each request's remote range is contiguous: its pieces land packed
    for first, count, remote, _ in plan:
        frags = parsed.frags[first:first + count]
        assert frags[0, 1] == remote and (frags[:, 1] - remote == np.cumsum(frags[:, 2]) - frags[:, 2]).all()


def test_reads_use_max_sge_rd():
    limits = {"max_sge": 30, "max_sge_rd": 16}
    assert sge_limit("batched", limits, verbs.WR_RDMA_READ) == 16
    assert sge_limit("batched", limits, verbs.WR_RDMA_WRITE) == 30
    assert sge_limit("one", limits, verbs.WR_RDMA_READ) == 1


def test_a_request_ends_where_remote_offsets_stop_being_contiguous():
    frags = np.array([[0, 0, 64], [128, 64, 64], [256, 4096, 64]], np.int64)
    assert plan_requests(frags, 30)[:, 1].tolist() == [2, 1]


def test_chain_links_requests_and_signals_only_the_last():
    parsed = parse_pattern("128x20KiB")
    plan = plan_requests(parsed.frags, 30)
    wrs, sges = build_chain(parsed.frags, plan, 0x10000, 7, 0x90000, 9, verbs.WR_RDMA_WRITE)
    for index, (first, count, remote, _) in enumerate(plan):
        at = index * verbs.WR_BYTES
        wr_id, nxt, sg_list, num_sge, opcode, flags = struct.unpack_from("QQQiiI", wrs, at)
        last = index == len(plan) - 1
        assert wr_id == index and num_sge == count and opcode == verbs.WR_RDMA_WRITE
        assert nxt == (0 if last else wrs.ctypes.data + at + verbs.WR_BYTES)
        assert flags == (verbs.SEND_SIGNALED if last else 0)
        assert sg_list == sges.ctypes.data + first * verbs.SGE_BYTES
        assert struct.unpack_from("QI", wrs, at + verbs.WR_REMOTE_ADDR) == (0x90000 + remote, 9)
    addr, length, lkey = struct.unpack_from("QII", sges, 3 * verbs.SGE_BYTES)
    assert (addr, length, lkey) == (0x10000 + int(parsed.frags[3, 0]), 20 * 1024, 7)


HEADER_CHECK = r"""
#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define O(n, t, f) printf("%s %zu\n", n, offsetof(struct t, f))
#define S(n, t) printf("%s %zu\n", n, sizeof(struct t))
int main(void) {
"""


def test_struct_layouts_match_verbs_h(tmp_path):
    """Every offset verbs.py hard-codes, computed from the installed header (compiles a tiny
    program: skipped without gcc or libibverbs-dev)."""
    gcc = shutil.which("gcc")
    if not gcc or not Path("/usr/include/infiniband/verbs.h").exists():
        pytest.skip("needs gcc and libibverbs-dev's verbs.h")
    lines = []
    for name in verbs.LAYOUT:
        struct_name, _, member = name.partition(".")
        if struct_name == "ops":
            lines.append(f'O("{name}", ibv_context_ops, {member});')
        elif member:
            lines.append(f'O("{name}", {struct_name}, {member});')
        else:
            lines.append(f'S("{name}", {struct_name});')
    source = tmp_path / "layout.c"
    source.write_text(HEADER_CHECK + "\n".join(lines) + "\nreturn 0; }\n")
    subprocess.run([gcc, str(source), "-o", str(tmp_path / "layout")], check=True)
    got = dict(line.split() for line in subprocess.run(
        [str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.splitlines())
    assert {k: int(v) for k, v in got.items()} == verbs.LAYOUT


# --- the compiled loops, with ctypes callbacks as the provider -------------------------------

POST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
POLL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class FakeProvider:
    """post_send / poll_cq as C function pointers: counts calls, completes after `delay` polls,
    writes `status` into the work completion."""

    def __init__(self, status: int = 0, delay: int = 2):
        self.posted, self.polls, self.status, self.delay, self.pending = 0, 0, status, delay, 0
        self.post = POST(self._post)
        self.poll = POLL(self._poll)

    def _post(self, qp, wr, bad):
        self.posted += 1
        self.pending += 1
        return 0

    def _poll(self, cq, entries, wc):
        self.polls += 1
        if self.pending and self.polls % self.delay == 0:
            self.pending -= 1
            ctypes.c_uint32.from_address(wc + verbs.WC_STATUS).value = self.status
            return 1
        return 0

    def args(self, wc: np.ndarray, bad: np.ndarray) -> tuple:
        address = lambda f: np.uint64(ctypes.cast(f, ctypes.c_void_p).value)  # noqa: E731
        return (address(self.post), address(self.poll), np.uint64(1), np.uint64(2),
                np.uint64(3), np.uint64(bad.ctypes.data), np.uint64(wc.ctypes.data))


def test_timed_loop_posts_and_polls_through_function_pointers():
    from nearlocal.rdma import kernels

    provider = FakeProvider()
    wc, bad = np.zeros(verbs.WC_BYTES // 4, np.uint32), np.zeros(1, np.uint64)
    ticks = np.zeros(4, np.uint64)
    assert kernels.post_to_completion(*provider.args(wc, bad), ticks, np.uint64(1 << 40)) == kernels.OK
    assert provider.posted == 4 and (ticks > 0).all()
    ticks = np.zeros(3, np.uint64)
    assert kernels.pipelined(*provider.args(wc, bad), 4, 16, ticks, np.uint64(1 << 40)) == kernels.OK
    assert provider.posted == 4 + 3 * 16 and provider.pending == 0


def test_an_error_completion_stops_the_loop():
    from nearlocal.rdma import kernels

    provider = FakeProvider(status=12)  # IBV_WC_RETRY_EXC_ERR
    wc, bad = np.zeros(verbs.WC_BYTES // 4, np.uint32), np.zeros(1, np.uint64)
    got = kernels.post_to_completion(*provider.args(wc, bad), np.zeros(2, np.uint64),
                                     np.uint64(1 << 40))
    assert got == kernels.BAD_COMPLETION


# --- probe on fake sysfs trees ---------------------------------------------------------------

def _device(root: Path, name: str = "rxe0", state: str = "4: ACTIVE") -> None:
    port = root / "sys/class/infiniband" / name / "ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs/types").mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "link_layer").write_text("Ethernet\n")
    (port / "lid").write_text("0x0\n")
    for index, gid, kind in ((0, "fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
                             (1, "fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2"),
                             (2, "0000:0000:0000:0000:0000:0000:0000:0000", "")):
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs/types" / str(index)).write_text(kind + "\n")


def test_probe_says_why_without_a_device(tmp_path):
    info = probe_rdma(SysRoot(tmp_path))
    assert not info.devices and "/sys/class/infiniband does not exist" in info.reason
    (tmp_path / "sys/class/infiniband").mkdir(parents=True)
    assert "is empty" in probe_rdma(SysRoot(tmp_path)).reason


def test_probe_lists_ports_gids_and_a_down_port(tmp_path):
    _device(tmp_path, state="1: DOWN")
    info = probe_rdma(SysRoot(tmp_path))
    assert info.reason == "no RDMA port is ACTIVE (rxe0 port 1 DOWN)"
    port = info.devices[0].ports[0]
    assert port.link_layer == "Ethernet" and len(port.gids) == 2 and gid_index(port) == 1


def test_probe_finds_an_active_device(tmp_path):
    _device(tmp_path)
    info = probe_rdma(SysRoot(tmp_path))
    assert info.reason == "" and info.devices[0].active_port().port == 1


def test_each_rdma_method_is_skipped_with_probe_reason(tmp_path, monkeypatch):
    from nearlocal.core.methods import get_method
    from nearlocal.probe import probe

    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(tmp_path))
    inventory = probe(SysRoot(tmp_path), calibrate=False, gpu=False)
    for name in ("rdma-write", "rdma-read", "rdma-rpc"):
        assert "/sys/class/infiniband does not exist" in get_method(name).needs(inventory)


# --- bad input ---------------------------------------------------------------------------------

def test_a_device_that_does_not_exist(tmp_path, monkeypatch):
    from nearlocal.rdma.device import _check_case

    _device(tmp_path)
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(tmp_path))
    with pytest.raises(UsageError, match=r"RDMA device .mlx5_9. does not exist .*rxe0"):
        _check_case("rdma-write")({"sge": "one", "device": "mlx5_9"}, parse_pattern("16KiB"))
    with pytest.raises(UsageError, match="sge=two must be one of one, batched"):
        _check_case("rdma-write")({"sge": "two", "device": ""}, parse_pattern("16KiB"))


def test_a_pattern_beyond_the_device_limits():
    from nearlocal.rdma.device import requests_for

    with pytest.raises(UsageError, match=r"1024 work requests .* holds 512 \(max_qp_wr\)"):
        requests_for("rdma-write", parse_pattern("1024x160B"), "one", {"max_qp_wr": 512})
    with pytest.raises(UsageError, match="beyond the device's max_mr_size 4096"):
        requests_for("rdma-read", parse_pattern("16KiB"), "batched", {"max_mr_size": 4096})


def _no_mpi(monkeypatch) -> None:
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS",
                 "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)


def test_an_rdma_method_without_mpi_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from nearlocal.rack.framework import refuse_without_mpi

    _no_mpi(monkeypatch)
    _device(tmp_path)  # a host with an active device: only MPI is missing
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(tmp_path))
    from nearlocal.frontends.cli import main

    assert main(["run", "--method", "rdma-write", "--size", "16KiB", "--budget", "0.01"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "two ranks of an MPI job" in err
    from nearlocal.core.cases import Case
    from nearlocal.probe import probe

    inventory = probe(SysRoot(tmp_path / "none"), calibrate=False, gpu=False)
    refuse_without_mpi([Case("rdma-read", "dram", "wb", "16KiB")], inventory)  # skipped, not refused


def test_without_a_device_every_rdma_case_is_skipped_with_probe_reason(tmp_path, capsys,
                                                                       monkeypatch):
    from nearlocal.frontends.cli import main
    from nearlocal.store import load
    from nearlocal.store.catalogue import list_runs

    _no_mpi(monkeypatch)
    monkeypatch.setattr("nearlocal.probe.probe_rdma", lambda root: probe_rdma(
        SysRoot(tmp_path / "none")))
    assert main(["run", "--method", "rdma-write,rdma-read,rdma-rpc", "--size", "64B",
                 "--budget", "0.01", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    (run,) = [load(p) for p in list_runs(tmp_path / "out")]
    assert set(run.cases["status"]) == {"skipped"} and len(run.cases) == 3
    assert run.cases["reason"].str.contains("/sys/class/infiniband does not exist").all()


def test_rpc_takes_one_message_size():
    from nearlocal.rdma.device import _check_rpc_pattern

    with pytest.raises(UsageError, match="rdma-rpc takes one message size"):
        _check_rpc_pattern(parse_pattern("1024x160B"))
    _check_rpc_pattern(parse_pattern("64B"))


# --- the rows' facts ---------------------------------------------------------------------------

def test_one_sided_rows_state_max_sge_requests_and_the_sync_share():
    from types import SimpleNamespace

    from nearlocal.rdma.one_sided import _one_sided_rows

    ctx = SimpleNamespace(case=SimpleNamespace(method="rdma-write"), params={"sge": "batched"},
                          overhead_ticks=10.0)
    got = {"raw": np.ones(5), "ns": np.full(5, 10_000.0), "wire_ns": np.full(4, 2_500.0),
           "window": 8, "requests": 5, "sges_per_request": 30, "sge_limit": 30,
           "bytes_checked": 2_621_440, "bytes_differing": 0, "device": "mlx5_0", "port": 1,
           "link_layer": "InfiniBand", "max_sge": 30, "max_sge_rd": 30, "max_qp_wr": 32768,
           "converged": True, "elapsed_s": 1.0}
    (row,) = _one_sided_rows(ctx, [got, {}])
    assert row.extra == {"max_sge": 30, "work_requests_per_sample": 5, "data_movement_ns": 2500.0}
    assert row.info["sync_share"] == pytest.approx(0.75) and row.failed == ""
    assert row.info["data_check"].startswith("ok")
    (bad,) = _one_sided_rows(ctx, [{**got, "bytes_differing": 3}, {}])
    assert bad.failed.startswith("data check: FAILED: 3 of")


def _copying(destination: np.ndarray, source: np.ndarray) -> FakeProvider:
    """A provider whose post_send does what the NIC's RDMA write does: copy the 64 B message
    into the peer's slot (then one completion)."""
    provider = FakeProvider(delay=1)

    def post(qp, wr, bad):
        ctypes.memmove(destination.ctypes.data, source.ctypes.data, 64)
        provider.pending += 1
        return 0

    provider.post = POST(post)
    return provider


def _at(words: np.ndarray, index: int = 0) -> np.uint64:
    return np.uint64(words.ctypes.data + 8 * index)


def test_rpc_client_and_server_loops_with_a_provider_that_delivers_by_copy():
    from nearlocal.rdma import kernels

    request, slot, reply, client_slot = (np.zeros(8, np.uint64) for _ in range(4))
    request[:7] = np.arange(7, dtype=np.uint64) + 7
    wc, bad = np.zeros(verbs.WC_BYTES // 4, np.uint32), np.zeros(1, np.uint64)
    forever, idle = np.uint64(1 << 40), np.uint64(1 << 20)
    # the client: each sample's reply arrives (an echo by copy) and is seen by its sequence
    echo = _copying(client_slot, request)
    ticks = np.zeros(3, np.uint64)
    assert kernels.rpc_client(*echo.args(wc, bad), _at(request, 7), _at(client_slot, 7),
                              np.uint64(100), ticks, forever) == kernels.OK
    assert (ticks > 0).all() and client_slot[7] == 102 and echo.pending == 0
    # the server: nothing in its slot (IDLE), a request (answered: echoed into the client's
    # slot), then STOP
    answer = _copying(client_slot, reply)
    state = np.zeros(2, np.int64)
    serve = (*answer.args(wc, bad), _at(slot), _at(reply), 8, state, forever, idle)
    assert kernels.rpc_server(*serve) == kernels.IDLE
    slot[:] = request
    slot[7] = 5
    assert kernels.rpc_server(*serve) == kernels.IDLE
    assert state.tolist() == [5, 1] and (client_slot == slot).all()
    slot[7] = kernels.STOP
    assert kernels.rpc_server(*serve) == kernels.STOPPED and state[1] == 1


def test_every_rdma_method_writes_its_region_so_a_devdax_needs_allow_write():
    """rdma-read writes what it reads into rank 0's region, and rank 1's is filled for the check:
    a region the user did not allow writing is never written."""
    from nearlocal.core.cases import Case

    for method, access in (("rdma-write", "write"), ("rdma-read", "read"), ("rdma-rpc", "write")):
        assert Case(method, "devdax:/dev/dax0.0", "wb", "16KiB", access=access).writes_region


def test_a_device_that_does_not_exist_is_one_line_exit_2(capsys, monkeypatch):
    from nearlocal.frontends.cli import main

    _no_mpi(monkeypatch)
    assert main(["run", "--method", "rdma-write", "--size", "16KiB", "--param", "device=mlx5_9",
                 "--budget", "0.01"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "RDMA device 'mlx5_9' does not exist" in err


# --- the send/recv RPC and the path MTU ---------------------------------------------------------

def test_case_ids_drop_default_transport_and_mtu():
    from nearlocal.core.cases import Case

    assert Case("rdma-rpc", "dram", "wb", "64B", params=(
        ("transport", "write"), ("mtu", "1024"))).id == "rdma-rpc/dram/wb/64B"
    assert Case("rdma-rpc", "dram", "wb", "64B", params=(
        ("transport", "send"),)).id == "rdma-rpc/dram/wb/64B/transport=send"
    assert Case("rdma-write", "dram", "wb", "16KiB", params=(
        ("sge", "batched"), ("mtu", "4096"))).id == "rdma-write/dram/wb/16KiB/mtu=4096"
    assert Case("rdma-read", "dram", "wb", "16KiB", access="read", params=(
        ("sge", "one"), ("mtu", "1024"))).id == "rdma-read/dram/wb/16KiB/sge=one"


@pytest.mark.parametrize(("method", "params", "match"), [
    ("rdma-rpc", {"transport": "recv"}, "transport=recv must be one of write, send"),
    ("rdma-write", {"mtu": "1000"}, "mtu=1000 must be one of 256, 512, 1024, 2048, 4096"),
    ("rdma-read", {"mtu": "big"}, "mtu=big must be one of"),
    ("rdma-rpc", {"mtu": "8192"}, "mtu=8192 must be one of"),
])
def test_bad_transport_or_mtu_is_bad_input(tmp_path, monkeypatch, method, params, match):
    from nearlocal.rdma.device import _check_case

    _device(tmp_path)
    monkeypatch.setenv("NEARLOCAL_SYSROOT", str(tmp_path))
    with pytest.raises(UsageError, match=match):
        _check_case(method)({"device": "", **params}, parse_pattern("64B"))
    for mtu in ("256", "512", "1024", "2048", "4096"):
        _check_case(method)({"device": "", "mtu": mtu}, parse_pattern("64B"))
    _check_case("rdma-rpc")({"device": "", "transport": "send"}, parse_pattern("64B"))


def _rdma_info(active_mtu: int):
    from nearlocal.probe.rdma import RdmaDevice, RdmaInfo, RdmaPort

    port = RdmaPort(1, "ACTIVE", "Ethernet", 0, [(1, "fe80::1", "RoCE v2")], "nlrdma0",
                    active_mtu=active_mtu, max_mtu=4096)
    return RdmaInfo([RdmaDevice("rxe0", [port], {"max_sge": 32, "max_sge_rd": 32,
                                                  "max_qp_wr": 1 << 20, "max_mr_size": 1 << 40})],
                    verbs=True)


def test_mtu_above_the_ports_active_mtu_says_device_port_and_active_mtu():
    from types import SimpleNamespace

    from nearlocal.rdma.device import mtu_needs

    low = SimpleNamespace(rdma=_rdma_info(1024))
    assert mtu_needs({"mtu": "4096", "device": ""}, low) == (
        "mtu=4096 is above rxe0 port 1's active MTU 1024: the path MTU cannot exceed it "
        "(mtu=1024 or less runs here)")
    assert mtu_needs({"mtu": "1024", "device": ""}, low) is None
    assert mtu_needs({"mtu": "4096", "device": ""}, SimpleNamespace(rdma=_rdma_info(4096))) is None
    # unknown active MTU (no port query): the connection checks both ends instead
    assert mtu_needs({"mtu": "4096", "device": ""}, SimpleNamespace(rdma=_rdma_info(0))) is None


def test_the_connection_refuses_a_path_mtu_above_either_end():
    from nearlocal.rdma.link import _check_ends

    _check_ends(1024, {0: 4096, 1: 1024})
    _check_ends(4096, {0: 4096, 1: 0})  # unknown on rank 1: its RTR decides
    with pytest.raises(RuntimeError, match="mtu=4096 is above rank 1's port active MTU 1024"):
        _check_ends(4096, {1: 1024, 0: 4096})


@pytest.fixture
def rdma_box(monkeypatch):
    """This box's inventory with an RDMA device whose port's active MTU the test sets, inside
    an MPI job as far as the rdma methods can tell."""
    import dataclasses

    from nearlocal.probe import probe

    base = probe(calibrate=False, gpu=False)
    monkeypatch.setattr("nearlocal.rdma.device.in_mpi_job", lambda: True)

    def box(active_mtu: int):
        info = _rdma_info(active_mtu)
        monkeypatch.setattr("nearlocal.rdma.device._devices", lambda: info)
        return dataclasses.replace(base, rdma=info)

    return box


def test_the_suite_holds_the_send_rpc_and_mtu_4096_rows(rdma_box):
    from nearlocal.core.suites import suite_cases

    ids = {case.id for case in suite_cases("rdma", rdma_box(1024))}
    assert {"rdma-rpc/dram/wb/64B", "rdma-rpc/dram/wb/64B/transport=send",
            "rdma-write/dram/wb/16KiB/mtu=4096",
            "rdma-read/dram/wb/16KiB/mtu=4096"} <= ids
    assert "rdma-write/dram/wb/16KiB" in ids and "rdma-write/dram/wb/16KiB/sge=one" in ids
    assert ids == {case.id for case in suite_cases("rdma", rdma_box(4096))}


@pytest.mark.parametrize("active_mtu", [1024, 4096])
def test_in_the_suite_a_port_below_mtu_4096_skips_those_rows_and_runs_the_rest(rdma_box,
                                                                              active_mtu):
    from nearlocal.core.suites import suite_cases
    from nearlocal.engine.plan import RunSettings, Skip, SkipKind, plan_cases

    inventory = rdma_box(active_mtu)
    plan = plan_cases(suite_cases("rdma", inventory), inventory, RunSettings(0.01))
    plan.refuse_bad_input()  # never the whole run
    skipped = {e.case.id: e.decision for e in plan.entries if not e.runs}
    if active_mtu == 4096:
        assert not skipped
        return
    assert set(skipped) == {"rdma-write/dram/wb/16KiB/mtu=4096",
                            "rdma-read/dram/wb/16KiB/mtu=4096"}
    for decision in skipped.values():
        assert isinstance(decision, Skip) and decision.kind is SkipKind.BEYOND_DEVICE
        assert "above rxe0 port 1's active MTU 1024" in decision.reason
    assert len(plan.runnable) == len(plan.entries) - 2


def test_an_mtu_the_user_named_above_the_active_mtu_is_one_line_of_bad_input(rdma_box):
    from nearlocal.core.cases import Case
    from nearlocal.engine.plan import Refuse, RunSettings, plan_cases

    inventory = rdma_box(1024)
    cases = [Case("rdma-write", "dram", "wb", "16KiB", params=(("mtu", "4096"),)),
             Case("rdma-rpc", "dram", "wb", "64B", params=(("mtu", "4096"),))]
    plan = plan_cases(cases, inventory, RunSettings(0.01))
    assert all(isinstance(e.decision, Refuse) for e in plan.entries)  # the MPI job raises on it
    with pytest.raises(UsageError) as refused:
        plan.refuse_bad_input()
    assert str(refused.value) == ("mtu=4096 is above rxe0 port 1's active MTU 1024: the path "
                                  "MTU cannot exceed it (mtu=1024 or less runs here)")
    assert plan_cases(cases, rdma_box(4096), RunSettings(0.01)).entries[0].runs


def test_probe_reads_the_ports_mtus_through_ibv_query_port():
    class Lib:  # ibv_query_port writing what a provider writes into ibv_port_attr
        def ibv_query_port(self, context, port, attr):
            struct.pack_into("III", attr, 0, 4, 5, 3)  # ACTIVE, max 4096, active 1024
            return 0

    assert verbs.port_attr(Lib(), 1, 1) == {"state": 4, "max_mtu": 4096, "active_mtu": 1024}
    failing = type("Failing", (), {"ibv_query_port": lambda self, c, p, a: 22})()
    assert verbs.port_attr(failing, 1, 1) == {}


def test_receive_request_layout():
    from nearlocal.rdma.requests import build_recv

    wr, sge = build_recv(0x10000, 64, 7)
    assert wr.size == verbs.RECV_WR_BYTES == 32
    wr_id, nxt, sg_list, num_sge = struct.unpack_from("QQQi", wr, 0)
    assert (wr_id, nxt, sg_list, num_sge) == (0, 0, sge.ctypes.data, 1)
    assert struct.unpack_from("QII", sge, 0) == (0x10000, 64, 7)


class TwoSided:
    """A provider for the send/recv RPC: post_send copies the message where the peer's posted
    receive takes it and queues a receive completion there (`deliver`), post_recv counts the
    receives posted; poll_cq completes from the CQ asked (SEND_CQ: send completions, RECV_CQ:
    receive completions). `log` keeps the order of posts; `rnr` counts a message that found no
    receive posted."""

    SEND_CQ, RECV_CQ = 2, 5

    def __init__(self, deliver):
        self.deliver, self.log, self.rnr = deliver, [], 0
        self.posted_recvs, self.recv_done, self.send_done = 0, 0, 0
        self.post = POST(self._post)
        self.recv = POST(self._recv)
        self.poll = POLL(self._poll)

    def _post(self, qp, wr, bad):
        self.log.append("send")
        self.send_done += 1
        self.deliver(self)
        return 0

    def _recv(self, qp, wr, bad):
        self.log.append("recv")
        self.posted_recvs += 1
        return 0

    def arrive(self) -> None:
        """A message from the peer lands in this side's posted receive."""
        if self.posted_recvs == 0:
            self.rnr += 1
            return
        self.posted_recvs -= 1
        self.recv_done += 1

    def _poll(self, cq, entries, wc):
        field = "recv_done" if cq == self.RECV_CQ else "send_done"
        if getattr(self, field):
            setattr(self, field, getattr(self, field) - 1)
            ctypes.c_uint32.from_address(wc + verbs.WC_STATUS).value = 0
            return 1
        return 0

    def args(self, wc: np.ndarray, bad: np.ndarray) -> tuple:
        address = lambda f: np.uint64(ctypes.cast(f, ctypes.c_void_p).value)  # noqa: E731
        return (address(self.post), address(self.recv), address(self.poll), np.uint64(1),
                np.uint64(self.SEND_CQ), np.uint64(self.RECV_CQ), np.uint64(3), np.uint64(4),
                np.uint64(bad.ctypes.data), np.uint64(wc.ctypes.data))


def test_send_rpc_client_posts_the_replys_receive_before_the_clock_and_polls_it():
    from nearlocal.rdma import kernels

    request, reply = np.zeros(8, np.uint64), np.zeros(8, np.uint64)
    request[:7] = np.arange(7, dtype=np.uint64) + 7

    def echo(side):  # the server's reply, sent back at once into the client's receive
        reply[:] = request
        side.arrive()

    client = TwoSided(echo)
    wc, bad = np.zeros(verbs.WC_BYTES // 4, np.uint32), np.zeros(1, np.uint64)
    ticks = np.zeros(3, np.uint64)
    assert kernels.rpc_send_client(*client.args(wc, bad), _at(request, 7), _at(reply, 7),
                                   np.uint64(100), ticks, np.uint64(1 << 40)) == kernels.OK
    assert (ticks > 0).all() and reply[7] == 102 and (reply == request).all()
    assert client.log == ["recv", "send"] * 3 and client.rnr == 0
    assert client.send_done == 0 and client.recv_done == 0  # every completion reaped
    # a reply whose sequence is not the request's: said, not timed as a round trip
    stale = TwoSided(lambda side: side.arrive())
    got = kernels.rpc_send_client(*stale.args(wc, bad), _at(request, 7), _at(np.zeros(8, np.uint64), 7),
                                  np.uint64(5), np.zeros(1, np.uint64), np.uint64(1 << 40))
    assert got == kernels.WRONG_REPLY


def test_send_rpc_server_reposts_its_receive_before_the_reply():
    from nearlocal.rdma import kernels

    slot, reply, client_slot = (np.zeros(8, np.uint64) for _ in range(3))

    def to_client(side):
        client_slot[:] = reply

    server = TwoSided(to_client)
    server.posted_recvs = 1  # the first receive, posted by the caller before the barrier
    wc, bad = np.zeros(verbs.WC_BYTES // 4, np.uint32), np.zeros(1, np.uint64)
    state = np.zeros(2, np.int64)
    serve = (*server.args(wc, bad), _at(slot), _at(reply), 8, state, np.uint64(1 << 40),
             np.uint64(1 << 20))
    assert kernels.rpc_send_server(*serve) == kernels.IDLE  # nothing arrived
    slot[:7] = np.arange(7, dtype=np.uint64) + 7
    slot[7] = 5
    server.arrive()
    assert kernels.rpc_send_server(*serve) == kernels.IDLE
    assert state.tolist() == [5, 1] and (client_slot == slot).all()
    assert server.log == ["recv", "send"] and server.posted_recvs == 1  # one receive waiting
    slot[7] = kernels.STOP
    server.arrive()
    assert kernels.rpc_send_server(*serve) == kernels.STOPPED and state[1] == 1
    assert server.log == ["recv", "send"]  # STOP is not answered


def test_rpc_rows_say_the_transport_and_what_was_timed():
    from types import SimpleNamespace

    from nearlocal.rdma.rpc import _rpc_rows

    ctx = SimpleNamespace(overhead_ticks=10.0)
    got = {"raw": np.ones(3), "ns": np.full(3, 8000.0), "echoed": True, "message_bytes": 64,
           "transport": "send", "device": "rxe0", "port": 1, "path_mtu": 1024,
           "active_mtu": 1024, "converged": True, "elapsed_s": 0.1}
    (row,) = _rpc_rows(ctx, [got, {"served": 3}])
    assert row.info["transport"] == "send" and row.info["path_mtu"] == 1024
    assert row.info["timed"].startswith("ibv_post_send of the request's SEND -> the reply's "
                                        "receive completion polled on rank 0's receive CQ")
    assert row.info["data_check"] == "ok: the last reply equals its request" and not row.failed
    (write,) = _rpc_rows(ctx, [{**got, "transport": "write", "echoed": False}, {"served": 3}])
    assert write.info["transport"] == "write" and "sequence word" in write.info["timed"]
    assert write.failed == "FAILED: the last reply differs from its request"


def test_the_mpi_jobs_plan_refuses_a_named_mtu_and_keeps_the_suites_as_skipped_rows(rdma_box):
    """What each rank of an MPI job decides before the run (rack/commands.py's job_plan): the
    user's `--param mtu=4096` on a 1024 port is the one-line error every rank exits 2 with; the
    suite's mtu=4096 rows are skipped rows and the run goes ahead."""
    from nearlocal.frontends.cli import build_parser
    from nearlocal.rack.commands import job_plan as _plan

    inventory = rdma_box(1024)
    named = build_parser().parse_args(["run", "--method", "rdma-write", "--size", "16KiB",
                                       "--param", "mtu=4096"])
    with pytest.raises(UsageError, match=r"^mtu=4096 is above rxe0 port 1's active MTU 1024"):
        _plan(named, inventory)
    suite = _plan(build_parser().parse_args(["run", "--suite", "rdma"]), inventory)
    skipped = [e for e in suite.planned.entries if not e.runs]
    assert len(skipped) == 2 and all("active MTU 1024" in e.reason for e in skipped)


# --- movers=k: k queue pairs at once (issue 57) -------------------------------------------------

def test_movers_is_a_parameter_of_the_one_sided_methods_checked_as_bad_input(rdma_box):
    from nearlocal.core.cases import Case
    from nearlocal.core.methods import get_method
    from nearlocal.rdma.device import _check_case

    rdma_box(1024)
    assert get_method("rdma-read").params["movers"] == "1"
    assert "movers" not in get_method("rdma-rpc").params
    assert Case("rdma-read", "dram", "wb", "16KiB", params=(("movers", "1"),)).id == \
        "rdma-read/dram/wb/16KiB"
    assert Case("rdma-read", "dram", "wb", "16KiB", params=(("movers", "2"),)).id == \
        "rdma-read/dram/wb/16KiB/movers=2"
    _check_case("rdma-read")({"movers": "4"}, parse_pattern("16KiB"))
    for bad in ("0", "x", "-2"):
        with pytest.raises(UsageError, match="malformed movers"):
            _check_case("rdma-write")({"movers": bad}, parse_pattern("16KiB"))


def test_k_movers_need_k_slots_within_max_mr_size():
    from nearlocal.rdma.device import requests_for

    limits = {**CX7, "max_mr_size": 3 * 16384}
    requests_for("rdma-read", parse_pattern("16KiB"), "batched", limits, movers=3)
    with pytest.raises(UsageError, match=r"spans 65536 bytes \(4 movers' slots\), beyond"):
        requests_for("rdma-read", parse_pattern("16KiB"), "batched", limits, movers=4)


def test_each_rank_maps_one_slot_per_mover():
    from types import SimpleNamespace

    from nearlocal.rdma.device import _pool_bytes, _region_bytes

    pattern = parse_pattern("128x20KiB")
    one = _region_bytes(pattern)
    assert one >= 128 * 20480 and one % 4096 == 0
    resolved = SimpleNamespace(pattern=pattern, params={"movers": "4", "sge": "batched"})
    assert _pool_bytes(resolved, 2) == 4 * one
    assert _pool_bytes(SimpleNamespace(pattern=pattern, params={"sge": "one"}), 2) == one


def test_the_rdma_suite_holds_16kib_by_two_queue_pairs_and_contention_the_kv_block(rdma_box):
    from nearlocal.core.suites import suite_cases
    from nearlocal.engine.plan import RunSettings, plan_cases
    from nearlocal.rdma.methods import CONTENTION_MOVERS, CONTENTION_PATTERN

    inventory = rdma_box(4096)
    ids = {case.id for case in suite_cases("rdma", inventory)}
    assert {"rdma-write/dram/wb/16KiB/movers=2", "rdma-read/dram/wb/16KiB/movers=2"} <= ids
    contention = [c for c in suite_cases("contention", inventory) if c.method.startswith("rdma")]
    assert [c.effective_params["movers"] for c in contention] == [
        str(k) for k in CONTENTION_MOVERS]
    assert {c.pattern for c in contention} == {CONTENTION_PATTERN}
    assert contention[0].id == f"rdma-read/dram/wb/{CONTENTION_PATTERN}"  # the rdma suite's k = 1
    plan = plan_cases(contention, inventory, RunSettings(0.01))
    plan.refuse_bad_input()
    assert all(entry.runs for entry in plan.entries)


class SharedCq:
    """post_send / poll_cq as C function pointers for k QPs on one CQ: each post queues its
    chain's last wr_id; polls complete them newest first (the NIC need not finish them in the
    order they were posted), writing wr_id and status into the work completion."""

    def __init__(self, status: int = 0, wrong_id: bool = False):
        self.pending: list[int] = []
        self.qps: list[int] = []
        self.status, self.wrong_id = status, wrong_id
        self.post = POST(self._post)
        self.poll = POLL(self._poll)

    def _post(self, qp, wr, bad):
        while ctypes.c_uint64.from_address(wr + verbs.WR_NEXT).value:  # the chain's last WR
            wr = ctypes.c_uint64.from_address(wr + verbs.WR_NEXT).value
        self.qps.append(qp)
        self.pending.append(ctypes.c_uint64.from_address(wr).value)
        return 0

    def _poll(self, cq, entries, wc):
        if not self.pending:
            return 0
        wr_id = self.pending.pop()
        ctypes.c_uint64.from_address(wc).value = (99 << 32) if self.wrong_id else wr_id
        ctypes.c_uint32.from_address(wc + verbs.WC_STATUS).value = self.status
        return 1


def _fake_link(provider: SharedCq, k: int):
    from types import SimpleNamespace

    address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    qps = [SimpleNamespace(qp=100 + m, qp_num=7 + m, post_send=address(provider.post),
                           poll_cq=address(provider.poll), cq=5) for m in range(k)]
    return SimpleNamespace(qp=qps[0], qps=qps, bad=np.zeros(1, np.uint64),
                           wc=np.zeros(verbs.WC_BYTES, np.uint8))


def _rack_ctx():
    from types import SimpleNamespace

    from nearlocal.rack.framework import RackContext

    ctx = SimpleNamespace(timeout_s=5.0, tsc_hz=1e9, overhead_ticks=0.0)
    ctx.ns = lambda ticks, per=1: RackContext.ns(ctx, ticks, per)
    return ctx


def test_k_queue_pairs_post_back_to_back_and_each_completion_ends_its_mover():
    from nearlocal.rdma.one_sided import _MoverTransfers
    from nearlocal.rdma.requests import MOVER_ID_SHIFT

    provider = SharedCq()
    frags = parse_pattern("128x20KiB").frags
    plan = plan_requests(frags, 32)
    chains = [build_chain(frags, plan, 1 << 20, 1, 1 << 30, 2, verbs.WR_RDMA_READ,
                          first_id=m << MOVER_ID_SHIFT) for m in range(3)]
    session = _MoverTransfers(_rack_ctx(), _fake_link(provider, 3), [w for w, _ in chains],
                              int(frags[:, 2].sum()))
    raw, ns = session.sample(4)
    assert provider.qps == [100, 101, 102] * 4 and not provider.pending
    assert raw.shape == ns.shape == (4,) and (ns > 0).all()
    info = session.info
    assert info["movers"] == 3 and info["bytes_per_mover"] == 128 * 20480
    assert [m["qp"] for m in info["per_mover"]] == [0, 1, 2]
    assert [m["qp_num"] for m in info["per_mover"]] == [7, 8, 9]
    assert [len(s) for s in info["mover_samples_ns"]] == [4, 4, 4]
    assert info["aggregate_gbps"] > 0 and "3 queue pairs" in info["concurrency"]
    # newest first: the last mover posted completes first, so the first one's interval is longest
    assert info["per_mover"][0]["median_ns"] > info["per_mover"][2]["median_ns"]
    session.sample(2)  # sample r is mover r mod k, counted across batches
    assert session.tally.taken == 6


def test_a_bad_completion_or_an_unknown_mover_fails_the_movers_sample():
    from nearlocal.rdma.one_sided import _MoverTransfers

    frags = parse_pattern("16KiB").frags
    plan = plan_requests(frags, 32)
    for provider, match in ((SharedCq(status=12), "error status"),
                            (SharedCq(wrong_id=True), "names no mover")):
        chains = [build_chain(frags, plan, 1 << 20, 1, 1 << 30, 2, verbs.WR_RDMA_WRITE,
                              first_id=m << 32) for m in range(2)]
        session = _MoverTransfers(_rack_ctx(), _fake_link(provider, 2), [w for w, _ in chains],
                                  16384)
        with pytest.raises(RuntimeError, match=match):
            session.sample(1)


def test_chain_ids_name_their_mover():
    frags = parse_pattern("1024x160B").frags
    plan = plan_requests(frags, 32)
    wrs, _ = build_chain(frags, plan, 0, 1, 0, 2, verbs.WR_RDMA_READ, first_id=3 << 32)
    ids = [struct.unpack_from("Q", wrs, i * verbs.WR_BYTES)[0] for i in range(len(plan))]
    assert ids == [(3 << 32) + i for i in range(len(plan))]


def test_a_movers_row_carries_k_each_movers_figures_and_no_pipelined_split():
    from types import SimpleNamespace

    from nearlocal.rdma.one_sided import _one_sided_rows

    ctx = SimpleNamespace(case=SimpleNamespace(method="rdma-read"),
                          params={"sge": "batched", "movers": "2"}, overhead_ticks=10.0)
    movers_info = {"movers": 2, "bytes_per_mover": 16384, "aggregate_gbps": 3.0,
                   "per_mover": [{"qp": 0, "median_ns": 10_000.0, "gbps": 1.6},
                                 {"qp": 1, "median_ns": 11_000.0, "gbps": 1.5}],
                   "mover_samples_ns": [[10_000.0], [11_000.0]], "timed": "each mover's own",
                   "concurrency": "2 queue pairs"}
    got = {"raw": np.ones(4), "ns": np.full(4, 10_000.0), "window": 1, "requests": 1,
           "sges_per_request": 1, "sge_limit": 32, "movers": 2, "movers_info": movers_info,
           "bytes_checked": 32768, "bytes_differing": 0, "device": "rxe0", "max_sge": 32,
           "max_sge_rd": 32}
    (row,) = _one_sided_rows(ctx, [got, {}])
    assert row.info["movers"] == 2 and row.info["per_mover"][1]["qp"] == 1
    assert row.info["timed"] == "each mover's own" and "sync_share" not in row.info
    assert row.extra == {"max_sge": 32, "work_requests_per_sample": 1}
    assert row.info["data_check"] == "ok: 32768 bytes on rank 1 equal rank 0's"


def _rdma_row(method: str, median: float, params: dict, info: dict | None = None) -> dict:
    from tests.report_fixtures import row

    data = row(method, access="read" if method == "rdma-read" else "write", params=params,
               median=median)
    data["info"] = info or {}
    return data


def test_the_contention_fit_takes_rdma_movers_rows_beside_the_same_way_alone(tmp_path):
    """From a stored run: the movers=2 row of rdma-read 16KiB (SGE-batched, path MTU 1024) sits
    beside the k = 1 row moved the same way, not the sge=one or mtu=4096 rows of that pattern,
    and the what-if's path model never takes it as a transfer alone."""
    from nearlocal.store import load
    from nearlocal.whatif.contention import contention_of
    from nearlocal.whatif.fit import usable_rows
    from tests.report_fixtures import make_run

    movers = {"movers": 2, "bytes_per_mover": 16384, "aggregate_gbps": 2.5,
              "per_mover": [{"qp": 0, "median_ns": 12_000.0}, {"qp": 1, "median_ns": 14_000.0}],
              "mover_samples_ns": [[12_000.0, 12_500.0], [14_000.0]]}
    rows = [_rdma_row("rdma-read", 10_000.0, {}),
            _rdma_row("rdma-read", 30_000.0, {"sge": "one"}),
            _rdma_row("rdma-read", 8_000.0, {"mtu": "4096"}),
            _rdma_row("rdma-read", 13_000.0, {"movers": "2"}, movers),
            _rdma_row("rdma-write", 9_000.0, {})]  # no movers rows: no way
    run = load(make_run(tmp_path, rows))
    got = contention_of(run.cases, run.samples)
    assert list(got) == ["rdma/rdma-read"]
    way = got["rdma/rdma-read"]
    assert sorted(way) == [1, 2]
    assert way[1]["rows"] == [rows[0]["case_id"]]
    assert way[1]["per_mover_gbps"] == pytest.approx(16384 / 10_000.0)
    assert way[2]["rows"] == [rows[3]["case_id"]]
    assert way[2]["aggregate_gbps"] == 2.5 and way[2]["service_ns"]["n"] == 5  # store samples
    assert way[2]["per_mover_gbps"] == pytest.approx(16384 / 13_000.0)
    assert way[2]["per_mover"][1]["qp"] == 1
    assert rows[3]["case_id"] not in set(usable_rows(run.cases)["case_id"])
    assert rows[0]["case_id"] in set(usable_rows(run.cases)["case_id"])
