"""RDMA over verbs: Beluga's other column (docs/rdma.md)."""
