"""Counts what resolving a case costs, in every process of a job that loads it
(NEARLOCAL_PLUGINS=tests.count_plugin: an MPI job's ranks and their workers alike): each pattern
parsed, each case's row facts derived, each case's spans computed. One line per call appended to
the file NEARLOCAL_TEST_COUNTS names: the MPI rank, what was done, of what (test_resolved_once)."""

import os
import sys

from nearlocal.core import patterns, rows
from nearlocal.core.cases import Case

COUNTS = os.environ["NEARLOCAL_TEST_COUNTS"]
RANK = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "?"))


def _note(what: str, key: str) -> None:
    with open(COUNTS, "a") as out:  # one short append per call: whole lines from every process
        out.write(f"{RANK}\t{what}\t{key}\n")


def _count(module, name: str, what: str, key) -> None:
    """`module.name` counted wherever a nearlocal module imported it (modules imported later
    take the counted one from `module`)."""
    original = getattr(module, name)

    def counted(*args, **kwargs):
        _note(what, key(*args))
        return original(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("nearlocal") \
                and getattr(loaded, name, None) is original:
            setattr(loaded, name, counted)


_count(patterns, "parse_pattern", "parse", lambda text: text)
_count(rows, "row_facts", "row_facts", lambda case, *rest: case.id)
_spans = Case.spans


def _counted_spans(case, pattern=None):
    _note("spans", case.id)
    return _spans(case, pattern)


Case.spans = _counted_spans
