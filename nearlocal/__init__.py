"""nearlocal: how close to local memory is each memory path of this box."""

__version__ = "0.1.0"
