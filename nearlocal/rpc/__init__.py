"""Shared-memory RPC slots and a single-writer / multi-reader record store, with the fault
injector that checks the store never exposes a torn record (Beluga's software coherence)."""
