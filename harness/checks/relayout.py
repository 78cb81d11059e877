"""relayout: blocks the subject extracts under one layout setting of a release and injects under another (an offload
or connector cache written under one KVCacheLayout or VLLM_KV_CACHE_LAYOUT, read under another) hold the same K and
V, token by token, read through the second setting's views; or the subject refuses the inject with an error and
leaves the target untouched. A raw copy of a block's bytes passes every size check (both settings' blocks hold the
same bytes) and moves values wherever the two settings order a block's memory differently.

Its targets are pairs of geometries of one release, backend, cache dtype and layer arrangement; its examples are the
transfer check's (harness.checks.transfer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import checks
from harness.checks.outcome import Outcome
from harness.checks.transfer import Moved, moved
from harness.contract import Contract
from harness.run.session import Session, layer_of
from harness.run.targets import Target, outside
from harness.run.trial import Trial


@dataclass(frozen=True)
class Pair(Target):
    """A geometry (the source) and `peer`, the geometry of another layout setting of the same release and backend
    that blocks move into."""

    peer: Contract = field(kw_only=True)

    @property
    def geometry(self) -> str:
        """The pair's name in result lines: `source->peer`."""
        return f"{self.contract.name}->{self.peer.name}"


def pairs(session: Session) -> list[Pair]:
    """Pairs of geometries one release hands a layer of one backend, cache dtype and layer arrangement under two
    layout settings (VLLM_KV_CACHE_LAYOUT NHD/HND, or KVCacheLayout members): each geometry of such a group is the
    source of one pair and the target of another (the group in a cycle), a pair several backends share once."""
    out: list[Pair] = []
    for r in session.releases:
        groups: dict[tuple, dict[Contract, None]] = {}
        for c in r.contracts:
            if session.selects(c) and not outside(c, session.sizes):
                groups.setdefault((c.origin.backend_name, c.cache_dtype, c.layout.shared), {})[c] = None
        found: dict[tuple[Contract, Contract], None] = {}
        for group in groups.values():
            ring = list(group)
            for i, c in enumerate(ring if len(ring) > 1 else ()):
                found.setdefault((c, ring[(i + 1) % len(ring)]), None)
        out += [Pair(r, a, peer=b) for a, b in found]
    return out


class Relayout(Moved):
    def targets(self, session: Session) -> list[Pair]:
        return pairs(session)

    def body(self, t: Trial) -> Outcome:
        ex, pair = t.example, t.target
        return moved(t, pair.peer, layer_of(pair.release, pair.peer, ex.dims, ex.case.torch_dtype), refusable=True)


IMPLEMENTATION = Relayout(checks.RELAYOUT)
