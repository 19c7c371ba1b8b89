"""Which methods have a multi-thread form, as plain data: registering a method asks this without
compiling anything (kernels.parallel builds the bodies from it, with numba, when a run needs them)."""

THREAD_FORMS = {  # the methods with a multi-thread form (issue 14): reads?, warm?, what a thread times
    "load": (True, True, "64-byte vector loads of the thread's share, warm"),
    "store": (False, False, "64-byte vector stores to the thread's share, then mfence"),
    "nt-store": (False, False, "nontemporal stores to the thread's share, then sfence"),
    "nt-copy": (False, True, "loads (warm) and nontemporal stores of the thread's share, "
                             "then sfence"),
    "memcpy": (False, True, "libc memcpy of the thread's share (source warm), then mfence"),
}
