"""storage's hops for the what-if (a face of the family, loaded only by whatif/paths.py through
the entry-point group nearlocal.serving_hops): rows whose method delivers from files on storage
stand for the NVMe legs of the `nvme` serving path (whatif/paths.py)."""

from __future__ import annotations

from nearlocal.whatif.paths import GPU, LOCAL, Hop, register_hop

register_hop(Hop("nvme->host", "files on storage -> host DRAM", frozenset({"storage"}), None, LOCAL))
register_hop(Hop("nvme->gpu", "files on storage -> GPU", frozenset({"storage"}), None, GPU))
