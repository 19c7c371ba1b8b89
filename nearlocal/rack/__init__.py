"""Rack scale: one nearlocal run across the hosts of an MPI job sharing one pool (docs/rack.md)."""
