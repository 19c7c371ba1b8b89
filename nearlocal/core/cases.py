"""Cases: method x region x attribute x pattern (x peer, x parameters). Plain, hashable data with a
stable id; `skip()` says why (of which kind) a case cannot run on this box, before anything is
compiled; `engine/plan.py` asks it once per case."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING

from nearlocal.core.methods import PEER_STUB_BYTES, Method, get_method
from nearlocal.errors import UsageError
from nearlocal.params import decode_params, encode_params
from nearlocal.probe import HostInventory
from nearlocal.regions import attribute_unavailable, capacity_problem, parse_region, region_kind
from nearlocal.units import size_spelled_once

if TYPE_CHECKING:
    from nearlocal.core.patterns import Pattern
    from nearlocal.regions import RegionSpec


class SkipKind(enum.Enum):
    """Why a case is skipped, as a kind: exit codes and whole-run refusals are chosen from the
    kind, never from the reason's text."""

    UNAVAILABLE = "unavailable"  # the method, region or attribute is not on this box
    NOT_APPLICABLE = "not-applicable"  # the method does not run on this region (peer) space
    CANNOT_HOLD = "cannot-hold"  # more than the region's free memory or space
    READ_ONLY = "read-only"  # writes to a region that cannot take them (a read-only fs)
    NEEDS_ALLOW_WRITE = "needs-allow-write"  # writes to user-owned memory without --allow-write
    NOT_ON_BOX = "not-on-box"  # accept: a case the box refused as input (numa:7 on one node)
    # a parameter beyond what the box's device takes (Method.case_needs: an RDMA path MTU above
    # the port's active MTU); bad input when every selected case is one (engine/plan.py)
    BEYOND_DEVICE = "beyond-device"


@dataclass(frozen=True)
class Case:
    method: str
    region: str  # the region under test (a pool, a node, a GPU...)
    attr: str = "wb"
    pattern: str = "16KiB"  # a size or a fragment pattern (workloads.patterns)
    peer: str = "dram"  # the other side: where reads land, where writes come from
    access: str = ""  # "read" or "write"; empty means the method's first
    params: tuple[tuple[str, str], ...] = ()  # method knobs, sorted (key, value) pairs
    suite: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        """Params equal to the method's declared default are dropped: `--param drain=before` (or
        a spec's `params = { drain = "before" }`) and no param are one case with one id."""
        if not self.access:
            object.__setattr__(self, "access", self.method_entry.accesses[0])
        params = sorted((str(k), str(v)) for k, v in self.params)
        if params:
            try:
                defaults = self.method_entry.params
            except UsageError:  # an unknown method: validate() says so
                defaults = {}
            params = [(k, v) for k, v in params if k not in defaults or str(defaults[k]) != v]
        object.__setattr__(self, "params", tuple(params))
        object.__setattr__(self, "pattern", size_spelled_once(str(self.pattern)))

    @cached_property
    def method_entry(self) -> Method:
        """The method's registry entry, looked up once per case (UsageError: no such method)."""
        return get_method(self.method)

    @cached_property
    def effective_params(self) -> Mapping[str, str]:
        """The parameters the case runs with, merged once: the method's defaults, then its own."""
        return MappingProxyType({**self.method_entry.params, **self.param_dict})

    def __getstate__(self) -> dict:
        """Pickled without what was looked up (a method's functions do not pickle): a process
        that gets the case looks its method up once again."""
        return {k: v for k, v in self.__dict__.items()
                if k not in ("method_entry", "effective_params")}

    @property
    def id(self) -> str:
        parts = [self.method, self.region, self.attr, self.pattern]
        method = self.method_entry
        if self.access != method.accesses[0]:
            parts.append(self.access)
        if self.peer != "dram":
            parts.append(f"peer={self.peer}")
        parts += [f"{k}={v}" for k, v in self.params]
        return "/".join(parts)

    @property
    def param_dict(self) -> dict[str, str]:
        return dict(self.params)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["params"] = encode_params(dict(self.params))
        data["case_id"] = self.id
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Case:
        params = decode_params(data.get("params"))
        return cls(method=data["method"], region=data["region"], attr=data["attr"],
                   pattern=data["pattern"], peer=data.get("peer", "dram"),
                   access=data.get("access", ""), params=tuple(params.items()),
                   suite=data.get("suite", ""))

    @property
    def writes_region(self) -> bool:
        return self.access == "write" or self.method_entry.stores_in_region

    @property
    def written(self) -> str:
        """The region or peer this case writes: the region on a write, the peer on a read (the
        bytes land there). Both are checked against --allow-write alike."""
        return self.region if self.writes_region else self.peer

    def spans(self, pattern: Pattern | None = None) -> tuple[int, int]:
        """Bytes the case maps in its (region, peer), as the worker maps them (`pattern`: this
        case's, already parsed)."""
        from nearlocal.core.patterns import parse_pattern

        pattern = pattern if pattern is not None else parse_pattern(self.pattern)
        if self.access == "write":  # as open_case swaps it: a read that stores (chase) does not
            pattern = pattern.swapped()
        region, peer = ((pattern.src_span, pattern.dst_span) if self.access == "read"
                        else (pattern.dst_span, pattern.src_span))
        try:
            touches_peer = self.method_entry.touches_peer
        except UsageError:  # an unknown method: validate() says so
            touches_peer = True
        return region, (peer if touches_peer else min(peer, PEER_STUB_BYTES))


@dataclass(frozen=True, eq=False)
class ResolvedCase:
    """A case with every fact about it derived once, by the plan: its pattern and both regions
    parsed, the method's parameters merged with the case's, the bytes it maps and the bytes one
    sample moves. This is what travels to the worker and to an MPI job's ranks (pickled: no text
    is parsed there again). Its row facts (core/rows.py) are not part of it: they stay with the
    plan's entry in the parent, which alone builds rows."""

    case: Case
    pattern: Pattern  # as given; a write's worker swaps it (scattered pieces land in the region)
    region: RegionSpec
    peer: RegionSpec
    params: dict  # the method's defaults, then the case's own
    spans: tuple[int, int]  # bytes mapped in (region, peer)
    bytes_moved: int  # what one sample moves (Method.bytes_moved): GB/s is derived from it

    @property
    def id(self) -> str:
        return self.case.id


Specs = tuple["RegionSpec", "RegionSpec"]  # a case's (region, peer), parsed


def parse_specs(case: Case) -> Specs:
    """The case's region and peer, parsed (UsageError for text that is no region)."""
    return parse_region(case.region), parse_region(case.peer)


def resolve(case: Case, pattern: Pattern | None = None, specs: Specs | None = None) -> ResolvedCase:
    """`case` resolved (`pattern`, `specs`: already parsed): its spans and bytes moved are
    computed here, once."""
    from nearlocal.core.patterns import parse_pattern

    pattern = pattern if pattern is not None else parse_pattern(case.pattern)
    region, peer = specs if specs is not None else parse_specs(case)
    return ResolvedCase(case, pattern, region, peer, dict(case.effective_params),
                        case.spans(pattern), case.method_entry.bytes_moved(pattern))


def validate(case: Case, inventory: HostInventory, pattern: Pattern | None = None,
             specs: Specs | None = None) -> None:
    """Bad input (unknown names, malformed specs, missing nodes/paths): UsageError, exit 2.
    `pattern`, `specs`: the case's, already parsed (else parsed here)."""
    from nearlocal.core.patterns import parse_pattern

    method = case.method_entry
    if case.access not in method.accesses:
        raise UsageError(f"method {case.method} cannot {case.access}: it does "
                         f"{' / '.join(method.accesses)}")
    unknown = [key for key, _ in case.params if key not in method.params]
    if unknown:
        raise UsageError(f"method {case.method} has no parameter {', '.join(unknown)}: valid are "
                         f"{', '.join(method.params) or 'none'}")
    if method.check_params:
        method.check_params(dict(case.effective_params))
    specs = specs if specs is not None else parse_specs(case)
    for spec in specs:
        region_kind(spec).validate(spec, inventory)
    attribute_unavailable(specs[0], case.attr)  # unknown attribute raises
    pattern = pattern if pattern is not None else parse_pattern(case.pattern)
    if method.check_pattern:
        method.check_pattern(pattern)
    if method.check_case:
        method.check_case(dict(case.effective_params), pattern)


def unavailable(case: Case, inventory: HostInventory, allow_write: bool) -> str | None:
    """Why this case cannot run here, or None (skip()'s reason, for `probe`'s matrix)."""
    found = skip(case, inventory, allow_write)
    return found[1] if found else None


def skip(case: Case, inventory: HostInventory, allow_write: bool,
         pattern: Pattern | None = None, specs: Specs | None = None,
         spans: tuple[int, int] | None = None) -> tuple[SkipKind, str] | None:
    """(kind, reason) when this case cannot run here, or None. Never compiles or touches
    memory. `pattern`, `specs`, `spans`: the case's, already parsed and computed (a resolved
    case's)."""
    method = case.method_entry
    reason = method.unavailable(inventory)
    if reason:
        return SkipKind.UNAVAILABLE, reason
    reason = method.case_needs(dict(case.effective_params), inventory) if method.case_needs else None
    if reason:
        return SkipKind.BEYOND_DEVICE, reason
    spec, peer = specs if specs is not None else parse_specs(case)
    kind, peer_kind = region_kind(spec), region_kind(peer)
    if kind.space not in method.region_spaces:
        return SkipKind.NOT_APPLICABLE, (
            f"{case.method} runs on {' / '.join(sorted(method.region_spaces))} regions, "
            f"not on {kind.space} ones")
    if peer_kind.space not in method.peer_spaces:
        return SkipKind.NOT_APPLICABLE, (
            f"{case.method} takes a {' / '.join(sorted(method.peer_spaces))} peer, "
            f"not a {peer_kind.space} one")
    for one, one_kind in ((spec, kind), (peer, peer_kind)):
        reason = one_kind.unavailable(one, inventory)
        if reason:
            return SkipKind.UNAVAILABLE, reason
    reason = attribute_unavailable(spec, case.attr)
    if reason:
        return SkipKind.UNAVAILABLE, reason
    spans = spans if spans is not None else case.spans(pattern)
    for one, size in zip((spec, peer), spans, strict=True):
        reason = capacity_problem(one, size)  # refused before anything is created
        if reason:
            return SkipKind.CANNOT_HOLD, reason
    written, written_kind = (spec, kind) if case.writes_region else (peer, peer_kind)
    if written_kind.read_only and written_kind.read_only(written):
        return SkipKind.READ_ONLY, written_kind.read_only(written)
    if written_kind.user_owned(written) and not allow_write:
        role = "" if case.writes_region else "the peer "
        return SkipKind.NEEDS_ALLOW_WRITE, (f"writes to {role}{case.written} need --allow-write "
                                            "(it may hold someone's data)")
    return None
