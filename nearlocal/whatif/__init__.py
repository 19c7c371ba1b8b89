"""What a box's measured paths mean for serving (issue 48, docs/whatif.md): a path model fitted
per hop from a run's rows (`fit`), the serving paths and their hops (`paths`), reference boxes
with provenance (`references`), per-request reload figures (`serving`) and the papers'
end-to-end claims recomputed (`claims`). From a notebook:

    from nearlocal import whatif
    result = whatif.for_run("latest", whatif.Request(model="llama-3.1-70b", context=32768))
    for path in result.paths: print(path.path, path.reload_ns)

Under load (`traffic`: traces, Poisson streams, the prefix store; `load`: the simulation):

    trace = whatif.read_trace("conversation.jsonl")
    work = whatif.trace_workload(trace, whatif.prefix_hits(trace))
    result = whatif.serve(inputs, work, whatif.Setup(prefill_tokens_per_s=40000, ttft_target_s=2))
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nearlocal.whatif.serving import Request, Whatif, WhatifInputs

# The public names, loaded at first use (PEP 562): `nearlocal --help` registers the command
# through this package and must not import pandas for it.
_PUBLIC = {
    "PathFit": "fit", "Prediction": "fit", "fit_run": "fit",
    "HOPS": "paths", "SERVING_PATHS": "paths",
    "ReferenceBox": "references", "load_reference": "references",
    "reference_names": "references", "run_reference": "references",
    "WhatifInputs": "serving", "PathFigures": "serving", "Request": "serving", "Whatif": "serving",
    "whatif": "serving",
    # serving under load (issue 57): requests, the prefix store, the simulation
    "read_trace": "traffic", "prefix_hits": "traffic", "poisson": "traffic", "Contexts": "traffic",
    "Setup": "load", "serve": "load", "trace_workload": "load", "stream_workload": "load",
    "LoadResult": "load", "PathLoad": "load",
}
__all__ = [*_PUBLIC, "for_run", "inputs_of", "reference_box"]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(f"nearlocal.whatif.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module 'nearlocal.whatif' has no attribute {name!r}")


def inputs_of(run) -> WhatifInputs:
    """A stored run (store.RunData) as the what-if's inputs: its hops fitted from its rows, and
    its inventory's links (which adapter a path's GPU shares)."""
    from nearlocal.probe.cpu import emulation_note
    from nearlocal.whatif.fit import fit_run
    from nearlocal.whatif.serving import WhatifInputs

    inventory = run.meta.get("inventory") or {}
    topology = inventory.get("topology")
    return WhatifInputs(fit_run(run.cases), run.run_id, emulation_note(inventory.get("cpu") or {}),
                  box=True, topology=topology if isinstance(topology, dict) else None)


def reference_box(name: str, root: Path | None = None):
    """A shipped reference box, a TOML file, or `run:REF`: a stored run promoted to one."""
    from nearlocal.whatif.fit import fit_run
    from nearlocal.whatif.references import load_reference, run_reference

    if name.startswith("run:"):
        from nearlocal.store import load
        from nearlocal.store.catalogue import DEFAULT_ROOT

        run = load(name.removeprefix("run:"), root or DEFAULT_ROOT)
        return run_reference(run, fit_run(run.cases))
    return load_reference(name)


def for_run(ref: str | Path | None, request: Request | None = None,
            reference: str | None = None, root: Path | None = None) -> Whatif:
    """The what-if of a stored run (`latest`, an id or a path) for one request."""
    from nearlocal.store import load
    from nearlocal.store.catalogue import DEFAULT_ROOT
    from nearlocal.whatif.serving import Request, whatif

    run = load(ref, root or DEFAULT_ROOT)
    return whatif(inputs_of(run), request or Request(),
                  reference_box(reference, root) if reference else None)
