"""rdma's hop for the what-if (a face of the family, loaded only by whatif/paths.py through the
entry-point group nearlocal.serving_hops): rows whose method delivers over an RDMA NIC stand for
another host's memory -> this host. The `rdma` serving path (whatif/paths.py) is made of it."""

from __future__ import annotations

from nearlocal.whatif.paths import Hop, register_hop

register_hop(Hop("rdma", "another host's memory -> this host over an RDMA NIC", frozenset({"nic"}),
                 None, None))
