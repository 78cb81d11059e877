"""Paged forward over the subject's own split of the release's kv_cache is bit-identical to its dense forward."""

from harness import checks

CHECK = checks.BIT_IDENTITY  # its declaration: what it needs, costs and draws


def check(run, ex, _):
    p = run.prepare(ex)
    keys, values = run.split(p, ex)
    tile = run.call(run.subject.tile_config, ex.case)  # pinned for both calls: autotuning would change rounding
    paged = run.call(run.subject.paged_forward, ex.case, p.q, keys, values, p.paging, tile)
    dense = run.call(run.subject.dense_forward, ex.case, p.q, p.k, p.v, tile)
    return run.compare(paged, dense, f"paged vs dense, tile {tile}")


def test_bit_identity(conformance, target):
    conformance.run(target, CHECK, check)


def test_bit_identity_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
