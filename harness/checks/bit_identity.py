"""bit-identity: the paged forward over the subject's own split of the release's kv_cache is bit-identical to its
dense forward, one tile pinned for both (autotuning would change the rounding). Its examples are placed cases of
the geometry, the ambiguous sizes first."""

from __future__ import annotations

from harness import checks
from harness.checks.outcome import Outcome, compare
from harness.draws import strategies
from harness.draws.strategies import Sizes
from harness.run.implementation import Implementation
from harness.run.targets import Target
from harness.run.trial import Trial


class Placed(Implementation):
    """A check that hands the subject a cache with tokens written in it: placed cases, the ambiguous sizes first."""

    def explicit(self, target: Target, sizes: Sizes):
        return strategies.explicit(target.contract, sizes)


class BitIdentity(Placed):
    def body(self, t: Trial) -> Outcome:
        case, p = t.example.case, t.prepare()
        keys, values = t.split(p)
        tile = t.call(t.subject.tile_config, case)  # pinned for both calls: autotuning would change rounding
        paged = t.call(t.subject.paged_forward, case, p.q, keys, values, p.paging, tile)
        dense = t.call(t.subject.dense_forward, case, p.q, p.k, p.v, tile)
        return compare(paged, dense, f"paged vs dense, tile {tile}")


IMPLEMENTATION = BitIdentity(checks.BIT_IDENTITY)
