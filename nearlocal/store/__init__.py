"""The store: one directory per run, written atomically, never overwritten."""

from nearlocal.store.catalogue import list_runs, resolve_run
from nearlocal.store.reader import RunData, load
from nearlocal.store.writer import Store

__all__ = ["RunData", "Store", "list_runs", "load", "resolve_run"]
