"""The papers' load claims (issue 57 item 4, whatif/load_claims.py): each names its rows and its
assumptions, a claim without its inputs says what is missing, and S4's two choices (migrate the
reclaimed blocks to host DRAM, or drop them and recompute) differ the way physics says: a slow
prefill makes dropping dearer, a slow host link makes migrating dearer. Small synthetic traces
keep it fast; the shipped conversation trace is used where present (skipped, with the reason,
where the checkout lacks it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nearlocal.store import load
from nearlocal.whatif import inputs_of
from nearlocal.whatif.claims import claims, paper_inputs
from nearlocal.whatif.load_claims import (
    TRACE,
    load_claims,
    place,
    reclaim_costs,
    shipped_trace,
)
from nearlocal.whatif.references import parse_reference
from nearlocal.whatif.serving import WhatifInputs
from nearlocal.whatif.traffic import Trace

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "fixtures" / "runs" / "h200-gpu-suite"
PAPERS = {name: paper_inputs(name) for name in ("beluga-h20", "swiftcache-media")}
LOAD_IDS = ("B3 load", "B16 load", "S1 load", "S4")


def revisit_trace(prefixes: int = 40, blocks: int = 4, gap_s: float = 1.0) -> Trace:
    """`prefixes` conversations of `blocks` 512-token blocks each, one a second, then each asked
    again in the same order: the reclaim at the midpoint falls between the two passes, so every
    reclaimed block is asked for again after it."""
    ids = [list(range(p * blocks, (p + 1) * blocks)) for p in range(prefixes)]
    order = ids + ids
    tokens = np.full(len(order), blocks * 512, np.int64)
    hashes = np.asarray([h for one in order for h in one], np.int64)
    offsets = np.arange(0, len(hashes) + 1, blocks, dtype=np.int64)
    return Trace("revisit", np.arange(len(order)) * gap_s, tokens, np.ones(len(order), np.int64),
                 hashes, offsets)


def media(host_gbps: float) -> WhatifInputs:
    """A box of SwiftCache's media with the host link at `host_gbps`."""
    box = parse_reference({"box": {"name": "t", "title": "t", "kind": "paper", "source": "test",
                                   "date": "2026"},
                           "link": [{"hop": "host->gpu", "bandwidth_gbps": host_gbps},
                                    {"hop": "gpu-peer", "bandwidth_gbps": 600.0}]}, "test")
    return WhatifInputs({hop: list(models) for hop, models in box.links.items()}, "test")


# ------------------------------------------------------------------------------- S4's physics


def test_place_migrates_or_drops_the_same_reclaimed_blocks():
    trace = revisit_trace()
    reclaim = float(trace.arrival_s[len(trace) // 2]) - 0.5
    migrate = place(trace, 160, reclaim, "migrate")
    drop = place(trace, 160, reclaim, "drop")
    kept = place(trace, 160, None, "drop")
    assert migrate.migrated_tokens == 80 * 512 and migrate.dropped_blocks == 0
    assert drop.dropped_blocks == 80 and drop.migrated_tokens == 0
    second = slice(len(trace) // 2, None)
    assert kept.miss_tokens[second].sum() == 0  # no reclaim: the second pass all hits
    assert migrate.host_tokens[second].sum() == 80 * 512  # the reclaimed half, from host DRAM
    assert migrate.miss_tokens[second].sum() == 0
    assert drop.miss_tokens[second].sum() >= 80 * 512  # at least the dropped half recomputed
    assert drop.host_tokens.sum() == 0


def _costs(host_gbps: float, prefill: float) -> dict:
    trace = revisit_trace()
    lent_gib = 160 * 128 / 1024  # 160 blocks of Qwen2.5-32B's 128 MiB
    found = reclaim_costs(media(host_gbps), trace, None, lent_gib=(lent_gib,), prefill=(prefill,))
    return found["table"][0]


def test_a_slow_prefill_makes_dropping_dearer_than_migrating():
    entry = _costs(host_gbps=16.0, prefill=1000.0)  # 2 s to recompute a 2K-token prefix
    migrate, drop = entry["migrate"], entry["drop"]
    assert migrate["migrated_bytes"] > 0 and migrate["migration_s"] > 0
    assert drop["extra_tokens"] > 0 and drop["migration_s"] == 0
    assert drop["cost_mean_s"] > migrate["cost_mean_s"] > 0


def test_a_slow_host_link_makes_migrating_dearer_than_dropping():
    entry = _costs(host_gbps=0.05, prefill=1e6)  # the migration alone takes minutes
    assert entry["migrate"]["migration_s"] > 60
    assert entry["migrate"]["cost_mean_s"] > entry["drop"]["cost_mean_s"] > 0


# ------------------------------------------------------------------- provenance and what is missing


def test_each_load_claim_names_its_rows_assumptions_and_limits():
    run = load(H200)
    found = {c.id: c for c in load_claims(inputs_of(run), PAPERS, run.samples, revisit_trace())}
    assert tuple(found) == LOAD_IDS
    for claim in found.values():
        assert claim.assumption and claim.explains and claim.reported
        assert "not given" in claim.assumption or "gives" in claim.assumption
    # the H200 run measured host -> GPU only: B3 and B16 say which hop is missing
    assert "rdma not measured" in found["B3 load"].this_box
    assert "not measured" in found["B16 load"].this_box and not found["B16 load"].rows
    # S1 and S4 stand on the run's PCIe rows, the peer GPU filled from the paper, labelled
    for key in ("S1 load", "S4"):
        assert found[key].rows and all("cuda-memcpy" in r for r in found[key].rows)
        assert "gpu-peer: reference swiftcache-media" in found[key].this_box
    assert "PCIe's tail from rows" in found["S1 load"].this_box
    # every input no paper gives is shown over a grid rather than picked
    assert "shown over 1, 2, 4, 8, 16" in found["B3 load"].assumption
    assert "20000, 80000 tokens/s" in found["S1 load"].assumption
    assert "64 GiB, 512 GiB" in found["S4"].assumption


def test_without_the_trace_or_the_hops_a_claim_says_what_is_missing():
    found = {c.id: c for c in load_claims(WhatifInputs(), PAPERS, None, None)}
    for key in ("S1 load", "S4"):
        assert found[key].this_box.startswith("needs the conversation trace")
        assert found[key].values["missing"].startswith("the trace")
    boxless = {c.id: c for c in load_claims(WhatifInputs(), PAPERS, None, revisit_trace())}
    for key in ("S1 load", "S4"):
        assert boxless[key].this_box.startswith("not measured on this box")
        assert "not measured" not in boxless[key].from_papers


def test_b3_queueing_turns_the_reloads_ratio_into_a_saturation():
    """With the paper's RDMA figures, 13.0 s from superblocks' reloads alone needs a link near
    saturation, where 16-token blocks (slower by their reload's ratio) are past it."""
    b3 = next(c for c in load_claims(WhatifInputs(), PAPERS, None, None) if c.id == "B3 load")
    papers = b3.values["papers"]
    assert papers["reload_ratio"] > 1
    assert 0.9 < papers["superblock_utilisation_for_13s"] < 1
    assert papers["blocks_utilisation_then"] == pytest.approx(
        papers["superblock_utilisation_for_13s"] * papers["reload_ratio"])
    rows = papers["by_links"]
    assert [r["links"] for r in rows] == [1, 2, 4, 8, 16]
    assert all(r["blocks"]["utilisation"] > r["superblocks"]["utilisation"] for r in rows)
    assert rows[0]["blocks"]["mean_ttft_s"] is None  # one link at 1.54 QPS: past saturation


def test_b16_the_pool_diverges_past_beluga_s_load():
    b16 = next(c for c in load_claims(WhatifInputs(), PAPERS, None, None) if c.id == "B16 load")
    pool, rdma = b16.values["papers"]["cxl-pool"], b16.values["papers"]["rdma"]
    assert pool["diverges_qps"] > 11.32 and rdma["diverges_qps"] < pool["diverges_qps"]
    assert rdma["p99_ttft_s"]["11.32"] is None  # past RDMA's divergence: no figure


@pytest.mark.skipif(not TRACE.is_file(), reason=f"the shipped trace is absent ({TRACE})")
def test_s1_over_the_shipped_trace_the_reduction_shrinks_as_the_prefill_slows():
    s1 = next(c for c in claims(WhatifInputs(), trace=shipped_trace()) if c.id == "S1 load")
    rows = s1.values["papers"]["by_prefill"]
    reductions = [r["reduction"] for r in rows]  # 20000, 80000 tokens/s, then the reload alone
    assert reductions == sorted(reductions) and reductions[-1] > 0.69


def test_a_given_prefill_rate_replaces_the_grid_and_is_said_given():
    found = {c.id: c for c in load_claims(WhatifInputs(), PAPERS, None, revisit_trace(),
                                          prefill=(40000.0,))}
    for key in ("S1 load", "S4"):
        assert "prefill per GPU given: 40000 tokens/s" in found[key].assumption
    assert [r["prefill_tokens_per_s"] for r in found["S1 load"].values["papers"]["by_prefill"]] \
        == [40000.0, None]
    assert [e["prefill_tokens_per_s"] for e in found["S4"].values["papers"]["table"]] == [40000.0] * 2


def test_the_command_carries_the_load_claims_and_the_given_prefill(capsys):
    import json

    from nearlocal.frontends.cli import main

    assert main(["whatif", str(H200), "--claims", "--json", "--prefill-tokens-per-s", "40000"]) == 0
    data = {c["id"]: c for c in json.loads(capsys.readouterr().out)["claims"]}
    assert set(LOAD_IDS) <= set(data)
    assert data["B3 load"]["values"]["papers"]["by_links"][0]["links"] == 1
    if TRACE.is_file():
        assert "given: 40000 tokens/s" in data["S4"]["assumption"]
    else:
        assert data["S4"]["this_box"].startswith("needs the conversation trace")
