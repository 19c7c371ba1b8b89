"""Facts a row carries that rows stored by older versions lack, derived from the registries as
they are now: the store fills them in when it loads such a run (store/runs.py); a new row has
them from its case (engine.runner.describe). The only place the store's data meets a registry,
and only for a row that lacks a fact: loading a current run imports no method or region module."""

from __future__ import annotations

from nearlocal.core.methods import METHODS, load_methods
from nearlocal.regions.base import POOL_CLASSES, pool_class_of


def effective_params_text(method: str, params: object) -> str:
    """JSON of the parameters a case really ran with: the method's declared defaults, the case's
    own (stored `params`, JSON text or a dict) over them; a method no longer registered: its own."""
    from nearlocal.params import decode_params_or_none, encode_params

    load_methods()
    given = decode_params_or_none(params)
    declared = METHODS[method].params if method in METHODS else {}
    return encode_params({**declared, **given})


def cpuless_nodes(inventory: object) -> frozenset[int]:
    """CPU-less nodes of a stored inventory (run.json's `inventory`)."""
    nodes = inventory.get("numa", []) if isinstance(inventory, dict) else []
    return frozenset(int(n["node"]) for n in nodes if isinstance(n, dict)
                     and isinstance(n.get("node"), int) and not n.get("cpus"))


def pool_class_column(stored: list, regions: list, inventory: object) -> list[str]:
    """Rows' `pool_class`: the stored column, else what the region kind declares now."""
    cpuless = cpuless_nodes(inventory)
    return [value if isinstance(value, str) and value in POOL_CLASSES
            else pool_class_of(str(region), cpuless) for value, region in zip(stored, regions,
                                                                              strict=True)]


def measures_column(stored: list, methods: list) -> list[str]:
    """Rows' `measures` (Method.measures): the stored column, else what the method declares now
    ("transfer" for a method no longer registered). The method modules are loaded only for a
    row that lacks it: reading a current run imports none."""
    known = ("transfer", "operation")
    if any(value not in known for value in stored):
        load_methods()
    return [value if value in known else getattr(METHODS.get(str(method)), "measures", "transfer")
            for value, method in zip(stored, methods, strict=True)]
