"""The store: one directory per run, written atomically, never overwritten."""

from nearlocal.store.runs import RunData, Store, list_runs, load, resolve_run

__all__ = ["RunData", "Store", "list_runs", "load", "resolve_run"]
