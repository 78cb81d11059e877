"""Paged forward over the subject's own split of the release's kv_cache is bit-identical to its dense forward."""

from harness import checks
from harness.checks.outcome import compare

CHECK = checks.BIT_IDENTITY  # its declaration: what it needs, costs and draws


def check(t):
    case, p = t.example.case, t.prepare()
    keys, values = t.split(p)
    tile = t.call(t.subject.tile_config, case)  # pinned for both calls: autotuning would change rounding
    paged = t.call(t.subject.paged_forward, case, p.q, keys, values, p.paging, tile)
    dense = t.call(t.subject.dense_forward, case, p.q, p.k, p.v, tile)
    return compare(paged, dense, f"paged vs dense, tile {tile}")


def test_bit_identity(conformance, target):
    conformance.run(target, CHECK, check)


def test_bit_identity_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
