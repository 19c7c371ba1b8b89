"""The CPU methods: their registrations (methods.py, chase.py), how they run on several
threads (threads.py) and what they compare local memory with (pool.py: the box's other CPU
memory in `quick`, the `mlc` suite); the compiled kernels they call are in nearlocal.kernels."""
