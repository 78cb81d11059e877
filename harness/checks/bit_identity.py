"""bit-identity: the paged forward over the subject's own split of the release's kv_cache is bit-identical to its
dense forward, one tile pinned for both (autotuning would change the rounding). Its examples are placed cases of
the geometry, the ambiguous sizes first; and of each model layer's views that its geometry does not have
(harness.run.targets.InModel), as the release allocated them, the rest of the allocation poisoned."""

from __future__ import annotations

from harness import checks
from harness.checks.outcome import Outcome, compare
from harness.draws import in_model, strategies
from harness.draws.strategies import Sizes
from harness.run.implementation import Implementation
from harness.run.session import Session
from harness.run.targets import InModel, Target, geometries, in_models
from harness.run.trial import Trial


class Placed(Implementation):
    """A check that hands the subject a cache with tokens written in it: placed cases, the ambiguous sizes first;
    over the session's geometries and the model layers handed views no geometry has."""

    def targets(self, session: Session) -> list[Target]:
        return geometries(session, self.check.kernels) + in_models(session, self.check.kernels)

    def examples(self, target: Target, sizes: Sizes):
        if isinstance(target, InModel):
            return in_model.examples(target.views, sizes, target.mode or None)
        return super().examples(target, sizes)

    def explicit(self, target: Target, sizes: Sizes):
        if isinstance(target, InModel):
            return in_model.explicit(target.views, sizes)
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
