"""dsa's compiled code (the kernels rule, docs/architecture.md): the address-level intrinsics,
the driver that submits descriptors and polls their records, and the software double's push."""
