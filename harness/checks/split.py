"""split-agrees: the subject's own K/V split of the release's kv_cache is the contract's split, the same views of the
same memory (shape, strides, storage offset, data pointer, storage). Equal views read equal values, so values are
not compared; a copy with equal values would still fail here, since it would hide a wrong layout from every later
write. The stride of an axis of size 1 addresses nothing (torch leaves it free), so strides are compared where the
size is not 1. Its examples are placements (harness.draws.strategies.placements), the ambiguous sizes first; and
each model layer's views that no geometry has (harness.run.targets.InModel), split as the model hands them."""

from __future__ import annotations

from harness import checks
from harness.checks.outcome import Outcome
from harness.compare import view_mismatch
from harness.contract import views
from harness.device import costs
from harness.draws import in_model, strategies
from harness.draws.strategies import Sizes
from harness.results import Word
from harness.run.implementation import Implementation
from harness.run.session import Session
from harness.run.targets import InModel, Target, geometries, in_models
from harness.run.trial import Trial


class Viewed(Implementation):
    """A check that looks at the views alone: placements of the geometry, its ambiguous sizes first; and of the
    model layers handed views no geometry has."""

    def targets(self, session: Session) -> list[Target]:
        return geometries(session, self.check.kernels) + in_models(session, self.check.kernels)

    def examples(self, target: Target, sizes: Sizes):
        if isinstance(target, InModel):
            return in_model.placements(target.views)
        return strategies.placements([target.contract], sizes)

    def explicit(self, target: Target, sizes: Sizes):
        if isinstance(target, InModel):
            return in_model.explicit(target.views, sizes)
        return strategies.explicit(target.contract, sizes)


class SplitAgrees(Viewed):
    def body(self, t: Trial) -> Outcome:
        ex = t.example
        kv_cache = t.allocate()
        got = t.subject_split(kv_cache)
        with costs.phase("compare"):
            want = views.split(ex.contract, kv_cache, ex.dims, ex.within)
            mismatches = [view_mismatch(a, b) for a, b in zip(got, want)]
        for name, wrong in zip("KV", mismatches):
            if wrong:
                return Outcome(Word.DIFFERS, f"{name} view of kv_cache {tuple(kv_cache.shape)} strides "
                                             f"{kv_cache.stride()}: {'; '.join(wrong)}")
        return Outcome(Word.BIT_IDENTICAL)


IMPLEMENTATION = SplitAgrees(checks.SPLIT_AGREES)
