"""The host probes' own walk (engine/stability/hostprobe.py): a dependent-load chase kept apart from
kernels/chase.py, the `chase` method's kernel. The probes are the yardstick code CI and box CI
hold a run's cases against; had they walked the chase method's kernel, a candidate tree whose
chase kernel was 1.25x slower would have made its own host read 1.25x slower too, and code CI
explained the regression away as a host move (issue 56). A change to this file is a change of
yardstick: each run records its fingerprint (`code_fingerprint`), and compare never lets a
probe whose code differs between the runs excuse a case.

The rings are laid by kernels/chase.py's build_ring (untimed: where the lines are, not how
they are walked)."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from nearlocal.kernels.intrinsics import tsc_begin, tsc_end


@njit(cache=True, nogil=True)
def probe_walk(words, start, hops):
    """Untimed walk (a probe's warm-up): the word index reached after `hops` hops."""
    p = np.uint64(start)
    for _ in range(hops):
        p = words[p]
    return p


@njit(cache=True, nogil=True)
def probe_time_chase(words, hops, samples, position):
    """Each sample: `hops` dependent loads between fenced rdtscp reads; position[0] carries the
    word index between calls (and keeps the walk's result live)."""
    p = np.uint64(position[0])
    for r in range(samples.size):
        t0 = tsc_begin()
        for _ in range(hops):
            p = words[p]
        t1 = tsc_end()
        samples[r] = t1 - t0
    position[0] = p


def code_of(source: str) -> str:
    """`source` as code only: its docstrings and comments dropped, the rest as ast.unparse
    writes it. A docstring or comment of the files below is no change of yardstick."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def code_fingerprint() -> str:
    """The first 12 hex digits of the SHA-256 of the code a probe's figure rests on (code_of:
    prose left out): this file, the fenced clock reads it inlines (kernels/intrinsics.py) and
    the ring's layout (kernels/chase.py's build_ring and what it calls): two runs whose probes
    walked the same code say the same, and a candidate that changes any of them changes the
    fingerprint. (Runs before this rule hashed the files' bytes, prose included: their
    fingerprints differ from every later run's.)"""
    import inspect

    from nearlocal.kernels import chase, intrinsics

    digest = hashlib.sha256(code_of(Path(__file__).read_text()).encode())
    digest.update(code_of(Path(intrinsics.__file__).read_text()).encode())
    for function in (chase.build_ring, chase.write_ring, chase.random_order):
        digest.update(code_of(inspect.getsource(function)).encode())
    return digest.hexdigest()[:12]
