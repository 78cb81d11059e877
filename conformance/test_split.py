"""The subject's own K/V split of the release's kv_cache is the contract's split: the same views of the same memory
(shape, strides, storage offset, data pointer, storage). Equal views read equal values, so values are not compared;
a copy with equal values would still fail here, since it would hide a wrong layout from every later write. The
stride of an axis of size 1 addresses nothing (torch leaves it free), so strides are compared where the size is
not 1."""

from harness import checks, costs
from harness.checks.outcome import Outcome
from harness.compare import view_mismatch
from harness.contract import views
from harness.results import Word

CHECK = checks.SPLIT_AGREES  # its declaration: what it needs, costs and draws


def check(t):
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


def test_split_agrees(conformance, target):
    conformance.run(target, CHECK, check)


def test_split_agrees_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
