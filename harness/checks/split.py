"""split-agrees: the subject's own K/V split of the release's kv_cache is the contract's split, the same views of the
same memory (shape, strides, storage offset, data pointer, storage). Equal views read equal values, so values are
not compared; a copy with equal values would still fail here, since it would hide a wrong layout from every later
write. The stride of an axis of size 1 addresses nothing (torch leaves it free), so strides are compared where the
size is not 1. Its examples are placements (harness.draws.strategies.placements), the ambiguous sizes first."""

from __future__ import annotations

from harness import checks
from harness.checks.outcome import Outcome
from harness.compare import view_mismatch
from harness.contract import views
from harness.device import costs
from harness.draws import strategies
from harness.draws.strategies import Sizes
from harness.results import Word
from harness.run.implementation import Implementation
from harness.run.targets import Target
from harness.run.trial import Trial


class Viewed(Implementation):
    """A check that looks at the views alone: placements of the geometry, its ambiguous sizes first."""

    def examples(self, target: Target, sizes: Sizes):
        return strategies.placements([target.contract], sizes)

    def explicit(self, target: Target, sizes: Sizes):
        return strategies.explicit(target.contract, sizes)


class SplitAgrees(Viewed):
    def body(self, t: Trial) -> Outcome:
        ex = t.example
        kv_cache = t.allocate()
        got = t.subject_split(kv_cache)
        with costs.phase("compare"):
            want = views.split(ex.contract, kv_cache, ex.dims)
            mismatches = [view_mismatch(a, b) for a, b in zip(got, want)]
        for name, wrong in zip("KV", mismatches):
            if wrong:
                return Outcome(Word.DIFFERS, f"{name} view of kv_cache {tuple(kv_cache.shape)} strides "
                                             f"{kv_cache.stride()}: {'; '.join(wrong)}")
        return Outcome(Word.BIT_IDENTICAL)


IMPLEMENTATION = SplitAgrees(checks.SPLIT_AGREES)
