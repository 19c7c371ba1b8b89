"""SwiftCache S3's layer stream: per layer, fetch the layer's KV from a donor GPU, compute, write
it back, the next fetch overlapping this compute; and whether that traffic hides behind compute."""

from __future__ import annotations

import numpy as np

from nearlocal.errors import UsageError
from nearlocal.gpu import timing
from nearlocal.gpu.session import GpuSession, enable_peer_access, int_param


def layer_stream_summary(round_trip_ns: np.ndarray, pass_ns: float, compute_pass_ns: float,
                         edge_ns: float, compute_ns: float, tolerance: float = 0.05) -> dict:
    """Does the per-layer fetch + write-back hide behind compute? It does when a whole pass takes
    no longer than compute alone (plus the first fetch and last write-back that nothing can hide,
    plus `tolerance`)."""
    median = float(np.median(round_trip_ns)) if len(round_trip_ns) else float("nan")
    return {
        "round_trip_median_ns": median,
        "compute_ns": compute_ns,
        "pass_ns": pass_ns,
        "compute_only_pass_ns": compute_pass_ns,
        "exposed_ns": max(0.0, pass_ns - compute_pass_ns - edge_ns),
        "round_trip_fits_compute": bool(median <= compute_ns),
        "hides_behind_compute": bool(pass_ns <= compute_pass_ns * (1 + tolerance) + edge_ns),
    }


class LayerStreamSession(GpuSession):
    """For layers 1..L: fetch layer l's KV (the pattern) from the donor GPU (the region) into a
    double buffer on the local GPU (the peer), compute for `compute_us` (a blocking kernel standing
    in for attention, one thread, leaving the SMs and copy engines free), write it back; fetch of
    l+1 overlaps compute of l. Samples: per-layer round trip (fetch + write-back, CUDA events) in
    device timing; the whole pass / L on the host clock in e2e timing."""

    def setup(self) -> None:
        cp, params = self.cp, self.ctx.params
        if self.src.device is None or self.dst.device is None:
            raise UsageError("layer-stream moves KV between two GPUs: --region gpu:J --peer gpu:K")
        self.layers = int_param(params, "layers", 1, 1024)
        if self.timing == "e2e":  # the whole pass on the host clock, / layers
            self.ops_per_sample = self.layers
        self.compute_ns = 1000 * int_param(params, "compute_us", 0, 10_000_000)
        self.copy = str(params.get("copy", "memcpy"))
        if self.copy not in ("memcpy", "kernel"):
            raise UsageError(f"copy={self.copy!r} is not valid: use memcpy or kernel")
        # the direction of the case does not matter: a layer goes out and back
        donor = self.src if self.ctx.case.access == "read" else self.dst
        table = self.table if self.ctx.case.access == "read" else self.table[:, [1, 0, 2]]
        span = int((table[:, 0] + table[:, 2]).max())
        local_span = int((table[:, 1] + table[:, 2]).max())
        enable_peer_access(cp, self.device, donor.device, required=self.copy == "kernel",
                           info=self.info)
        with cp.cuda.Device(donor.device):
            self.store = cp.empty(self.layers * span + 256, dtype=cp.uint8)
            # period 251: no two layers hold the same bytes, so a wrong layer fails the check
            self.kernel_lib.fill_device(cp, int(self.store.data.ptr), self.store.size,
                                        np.arange(251 * 4096) % 251 + 1)
            cp.cuda.Device(donor.device).synchronize()
        self.buffers = [cp.zeros(local_span + 256, dtype=cp.uint8) for _ in range(2)]
        self.fetch_tables = [table + np.array([k * span, 0, 0]) for k in range(self.layers)]
        self.streams = {name: cp.cuda.Stream(non_blocking=True) for name in ("compute", "back")}
        self._compute_out = cp.zeros(1, dtype=cp.uint64)
        if self.copy == "kernel":
            self.plan, _ = self.kernel_lib.plan_launch(
                table, width=int_param(params, "width", 4, 16),
                threads=int_param(params, "threads", 1, 1024))
            split = self.kernel_lib.split_pieces
            self.fetch_dev = [cp.asarray(split(t, self.plan.chunk)) for t in self.fetch_tables]
            self.back_dev = [cp.asarray(split(t[:, [1, 0, 2]], self.plan.chunk))
                             for t in self.fetch_tables]
            store, bufs = int(self.store.data.ptr), [int(b.data.ptr) for b in self.buffers]
            self.fetch_args = [self.kernels.copy_args(bufs[k % 2], store, int(t.data.ptr),
                                                      self.plan)
                               for k, t in enumerate(self.fetch_dev)]
            self.back_args = [self.kernels.copy_args(store, bufs[k % 2], int(t.data.ptr),
                                                     self.plan)
                              for k, t in enumerate(self.back_dev)]
            self.info.update(self.plan.info())
        count = self.layers
        self.ev = {name: [cp.cuda.Event() for _ in range(count)]
                   for name in ("fetch0", "fetch1", "compute1", "back0", "back1")}
        self.donor_device, self.donor_ptr = donor.device, int(self.store.data.ptr)
        self.info.update(layers=self.layers, compute_us=self.compute_ns / 1000, copy=self.copy,
                         layer_bytes=int(table[:, 2].sum()),
                         round_trip_bytes=2 * int(table[:, 2].sum()))  # fetch + write back
        self.compute_pass_ns: float | None = None  # measured once the timer is calibrated
        self._last_pass_ns = 0.0

    def _copy(self, layer: int, fetch: bool, stream) -> None:
        buf = self.buffers[layer % 2]
        if self.copy == "kernel":
            args = (self.fetch_args if fetch else self.back_args)[layer]
            self.kernels.launch("nl_copy", self.plan, args, stream)
            return
        runtime = self.cp.cuda.runtime
        local = int(buf.data.ptr)
        for s, d, n in self.fetch_tables[layer]:
            if fetch:
                runtime.memcpyPeerAsync(local + int(d), self.device, self.donor_ptr + int(s),
                                        self.donor_device, int(n), stream.ptr)
            else:
                runtime.memcpyPeerAsync(self.donor_ptr + int(s), self.donor_device,
                                        local + int(d), self.device, int(n), stream.ptr)

    def _pass(self, compute_only: bool = False) -> None:
        """Queue one pass over every layer (fetch on self.stream, compute, write-back)."""
        fetch, compute, back = self.stream, self.streams["compute"], self.streams["back"]
        ev = self.ev
        for layer in range(self.layers):
            if not compute_only:
                if layer >= 2:
                    fetch.wait_event(ev["back1"][layer - 2])  # its buffer is free again
                ev["fetch0"][layer].record(fetch)
                self._copy(layer, True, fetch)
                ev["fetch1"][layer].record(fetch)
                compute.wait_event(ev["fetch1"][layer])
            elif layer == 0:
                compute.wait_event(self.timer.start)
            self.kernels.spin(self.compute_ns, int(self._compute_out.data.ptr), compute)
            ev["compute1"][layer].record(compute)
            if not compute_only:
                back.wait_event(ev["compute1"][layer])
                ev["back0"][layer].record(back)
                self._copy(layer, False, back)
                ev["back1"][layer].record(back)
        last = ev["compute1" if compute_only else "back1"][self.layers - 1]
        fetch.wait_event(last)  # the timer's stop event on self.stream covers the whole pass

    def enqueue_range(self, lo: int, hi: int, marks: list | None = None) -> None:
        self._pass()

    def check(self) -> None:
        self.run_once()
        self.cp.cuda.Device(self.device).synchronize()
        last = self.layers - 1
        local = self.cp.asnumpy(self.buffers[last % 2])
        store = self.cp.asnumpy(self.store)
        bad = self.kernel_lib.fragments_match(local, store, self.fetch_tables[last])
        if bad is not None:
            raise RuntimeError(f"layer-stream fetched wrong bytes (layer {last}, fragment {bad})")

    def _per_layer(self) -> np.ndarray:
        get, ev = self.cp.cuda.get_elapsed_time, self.ev
        return np.array([(get(ev["fetch0"][i], ev["fetch1"][i]) +
                          get(ev["back0"][i], ev["back1"][i])) * 1e6
                         for i in range(self.layers)])

    def _record_other_timing(self) -> None:
        pass  # both figures are in the summary below

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.compute_pass_ns is None:  # after __init__ calibrated the blocking kernel
            self.compute_pass_ns = self.timer.queued(lambda: self._pass(compute_only=True))
        out, passes = [], []
        while sum(len(v) for v in out) < n:
            if self.timing == "device":
                passes.append(self.timer.queued(self._pass))
                out.append(self._per_layer())
            else:
                total = timing.end_to_end(self._pass, self.stream)
                passes.append(total)
                out.append(np.array([total / self.layers]))
        values = np.concatenate(out)
        device_pass = self.timer.queued(self._pass)
        first_fetch = self.cp.cuda.get_elapsed_time(self.ev["fetch0"][0], self.ev["fetch1"][0])
        last_back = self.cp.cuda.get_elapsed_time(self.ev["back0"][-1], self.ev["back1"][-1])
        self.info.update(layer_stream_summary(self._per_layer(), device_pass,
                                              self.compute_pass_ns,
                                              (first_fetch + last_back) * 1e6, self.compute_ns))
        self.info["pass_e2e_median_ns" if self.timing == "e2e" else "pass_median_ns"] = \
            float(np.median(passes))
        self.info.update(self.timer.info())
        if self.timing == "device":  # a layer's round trip is two event intervals
            return values / 1e6, np.maximum(values - 2 * self.overhead_ns, 0.0)
        return values, np.maximum(values - self.overhead_ns / self.layers, 0.0)

    def close(self) -> None:
        self.cp.cuda.Device(self.device).synchronize()
