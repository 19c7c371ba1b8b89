"""What a box's measured paths mean for serving (issue 48, docs/whatif.md): a path model fitted
per hop from a run's rows (`fit`), the serving paths and their hops (`paths`), reference boxes
with provenance (`references`), per-request reload figures (`serving`) and the papers'
end-to-end claims recomputed (`claims`). From a notebook:

    from nearlocal import whatif
    result = whatif.for_run("latest", whatif.Request(model="llama-3.1-70b", context=32768))
    for path in result.paths: print(path.path, path.reload_ns)
"""

from __future__ import annotations

from pathlib import Path

from nearlocal.whatif.fit import PathModel, Prediction, fit_run
from nearlocal.whatif.paths import HOPS, SERVING_PATHS
from nearlocal.whatif.references import (
    ReferenceBox,
    load_reference,
    reference_names,
    run_reference,
)
from nearlocal.whatif.serving import Inputs, PathFigures, Request, Whatif, whatif

__all__ = ["HOPS", "SERVING_PATHS", "Inputs", "PathFigures", "PathModel", "Prediction",
           "ReferenceBox", "Request", "Whatif", "for_run", "inputs_of", "load_reference",
           "reference_box", "reference_names", "whatif"]


def inputs_of(run) -> Inputs:
    """A stored run (store.RunData) as the what-if's inputs: its hops fitted from its rows."""
    cpu = (run.meta.get("inventory") or {}).get("cpu") or {}
    flags = cpu.get("flags") or {}
    emulated = ("measured in a virtual machine (its CPU reports `hypervisor`): host memory "
                "figures are the guest's, an emulated CPU (TCG) has no memory timing"
                if flags.get("hypervisor") else "")
    return Inputs(fit_run(run.cases), run.run_id, emulated)


def reference_box(name: str, root: Path | None = None) -> ReferenceBox:
    """A shipped reference box, a TOML file, or `run:REF`: a stored run promoted to one."""
    if name.startswith("run:"):
        from nearlocal.store import load
        from nearlocal.store.runs import DEFAULT_ROOT

        run = load(name.removeprefix("run:"), root or DEFAULT_ROOT)
        return run_reference(run, fit_run(run.cases))
    return load_reference(name)


def for_run(ref: str | Path | None, request: Request | None = None,
            reference: str | None = None, root: Path | None = None) -> Whatif:
    """The what-if of a stored run (`latest`, an id or a path) for one request."""
    from nearlocal.store import load
    from nearlocal.store.runs import DEFAULT_ROOT

    run = load(ref, root or DEFAULT_ROOT)
    return whatif(inputs_of(run), request or Request(),
                  reference_box(reference, root) if reference else None)
