"""Rows carry their region's pool class and their effective params (schema 3); older stores
derive both at load."""

from __future__ import annotations

import json

import pytest

from nearlocal.core.cases import Case
from nearlocal.core.rows import row_facts
from nearlocal.regions.base import POOL_CLASSES, REGION_KINDS, pool_class_of
from nearlocal.store import Store, load


@pytest.mark.parametrize(("region", "cpuless", "expected"), [
    ("devdax:/dev/dax0.0", (), "devdax"),
    ("numa:1", (1,), "cxl-node"),
    ("numa:1", (), "numa-node"),
    ("shm:x", (), "shared"),
    ("file:/tmp/x", (), "shared"),
    ("dram", (), "local"),
    ("dram:thp", (), "local"),
    ("pinned", (), "local"),
    ("gpu:0", (), "gpu"),
    ("registered:numa:2", (2,), "cxl-node"),
    ("registered:dram", (), "local"),
    ("storage:/tmp/x", (), "other"),
    ("no-such-kind:3", (), "other"),
])
def test_a_region_kind_declares_its_pool_class(region, cpuless, expected):
    assert pool_class_of(region, frozenset(cpuless)) == expected


def test_every_region_kind_declares_a_known_class():
    for kind in REGION_KINDS.values():
        declared = kind.pool_class
        if not callable(declared):
            assert declared in POOL_CLASSES, kind.name


def test_a_row_carries_its_pool_class_and_effective_params():
    row = row_facts(Case("load", "numa:1", "wb", "4KiB", params=(("drain", "none"),)),
                   frozenset({1}))
    assert row["pool_class"] == "cxl-node"
    params = json.loads(row["effective_params"])
    assert params["drain"] == "none"
    assert params["threads"] == "1"  # the method's declared default, filled in


def test_a_run_stored_before_schema_3_derives_both_at_load(tmp_path):
    meta = {"suite": "quick", "inventory": {"numa": [{"node": 0, "cpus": [0]},
                                                     {"node": 1, "cpus": []}]}}
    store = Store.create(tmp_path / "r", meta)
    old = {k: v for k, v in row_facts(Case("load", "numa:1", "wb", "4KiB")).items()
           if k not in ("pool_class", "effective_params")}
    store.add_case({**old, "status": "skipped", "reason": "old row"})
    run = load(store.finish(ended="now"))
    row = run.cases.iloc[0]
    assert row["pool_class"] == "cxl-node"
    assert json.loads(row["effective_params"])["threads"] == "1"
