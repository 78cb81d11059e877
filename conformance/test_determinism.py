"""The same inputs through the paged forward twice give the same bits."""

from harness import checks

CHECK = checks.DETERMINISM  # its declaration: what it needs, costs and draws


def check(run, ex, _):
    p = run.prepare(ex)
    keys, values = run.split(p, ex)
    tile = run.call(run.subject.tile_config, ex.case)
    first = run.call(run.subject.paged_forward, ex.case, p.q, keys, values, p.paging, tile)
    second = run.call(run.subject.paged_forward, ex.case, p.q, keys, values, p.paging, tile)
    return run.compare(second, first, f"second paged run vs first, tile {tile}")


def test_determinism(conformance, target):
    conformance.run(target, CHECK, check)


def test_determinism_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
