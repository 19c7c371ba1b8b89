"""What a recomputed claim is (`Claim`) and the papers' serving figures both kinds of claim
start from: the per-request claims (`claims.py`) and the load claims (`load_claims.py`) share
them here, so neither imports the other's module."""

from __future__ import annotations

from dataclasses import dataclass, field

from nearlocal.whatif.serving import Request

# B16's setup as the paper gives it (LV-Eval inputs over 15K tokens) and the model it names for B2
# (Qwen-32B); the paper does not say which Qwen-32B or which block layout served B16
B16_REQUEST = Request(model="qwen2.5-32b", context=16384)
B16_QPS = (1.54, 11.32)  # Mooncake, Beluga (all-hit)
B16_TTFT_S = (13.0, 1.36)
B3_TTFT_S = (13.0, 76.8)  # 256-token superblocks, 16-token blocks
# B16 does not give its adapter count: 2 per server (one per socket, as the paper's setting
# attaches each socket's adapter), 2 servers
B16_ADAPTERS = 4
S1_REDUCTION = 0.69


@dataclass(frozen=True)
class Claim:
    id: str
    what: str
    reported: str  # as the paper reports it
    from_papers: str  # the paper's own microbenchmarks through the model
    this_box: str  # this box's rows through the model, or why not
    assumption: str  # what the recomputation assumes (named, never silent)
    explains: str  # how much of the claim the paths explain; what they cannot
    values: dict = field(default_factory=dict)  # the numbers behind the texts
    rows: tuple[str, ...] = ()  # this box's case ids the figure came from
