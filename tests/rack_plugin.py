"""Small rack suites for the MPI tests (NEARLOCAL_PLUGINS=tests.rack_plugin): every rack method
once, at sizes a shared 2-core CI box runs in seconds."""

import os

from nearlocal.core.cases import Case
from nearlocal.core.suites import Suite, register_suite

# the test session names its own pool (tests/test_rack.py): two sessions at once on one box
# (a CI run beside a developer's) must not share one
POOL = os.environ.get("NEARLOCAL_TEST_RACK_POOL", "shm:nearlocal-test-rack")


def _three() -> list[Case]:
    return [
        Case("rack-rpc-roundtrip", POOL, "wb", "rpc:16x64B"),
        Case("rack-handoff", POOL, "wb", "64x160B", params=(("protocol", "coherent"),)),
        Case("rack-aggregate", POOL, "wb", "256KiB", access="read"),
        Case("rack-host-loss", POOL, "wb", "4KiB", params=(("kills", "4"),)),
    ]


def _two() -> list[Case]:
    return [
        Case("load", "dram", "wb", "4KiB"),
        Case("rack-rpc-throughput", POOL, "wb", "rpc:16x64B", params=(("qd", "8"),)),
        Case("rack-handoff", POOL, "wb", "16KiB"),
        Case("rack-host-loss", POOL, "wb", "16KiB", params=(("kills", "30"), ("recheck", "off"))),
    ]


def _once() -> list[Case]:
    return [
        Case("load", "dram", "wb", "4KiB"),
        Case("rack-handoff", POOL, "wb", "64x160B"),
        Case("rack-aggregate", POOL, "wb", "256KiB", access="read"),
    ]


def _loss() -> list[Case]:
    """Host loss first in the suite, aggregate after it: the run moves host loss last. Kills
    enough to run its whole (short) duration: the test stops the writer's rank mid-case."""
    return [
        Case("rack-host-loss", POOL, "wb", "4KiB", params=(("kills", "100000"),
                                                          ("duration", "3s"))),
        Case("rack-aggregate", POOL, "wb", "256KiB", access="read"),
    ]


register_suite(Suite("rack-test", "every rack method once, small (3 ranks)", [_three]))
register_suite(Suite("rack-test-two", "RPC throughput, handoff, the negative control", [_two]))
register_suite(Suite("rack-test-once", "a plain case and two rack cases, each its own pattern "
                     "(test_resolved_once counts what resolving them costs)", [_once]))
register_suite(Suite("rack-test-loss", "host loss (first, run last) and aggregate: the writer's "
                     "whole host is stopped mid-case (test_rack.py)", [_loss]))
