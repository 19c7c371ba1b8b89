"""The CPU methods: their registrations (methods.py, chase.py) and how they run on several
threads (threads.py); the compiled kernels they call are in nearlocal.kernels."""
