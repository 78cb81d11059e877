"""The same inputs through the paged forward twice give the same bits."""

from harness import checks
from harness.checks.outcome import compare

CHECK = checks.DETERMINISM  # its declaration: what it needs, costs and draws


def check(t):
    case, p = t.example.case, t.prepare()
    keys, values = t.split(p)
    tile = t.call(t.subject.tile_config, case)
    first = t.call(t.subject.paged_forward, case, p.q, keys, values, p.paging, tile)
    second = t.call(t.subject.paged_forward, case, p.q, keys, values, p.paging, tile)
    return compare(second, first, f"second paged run vs first, tile {tile}")


def test_determinism(conformance, target):
    conformance.run(target, CHECK, check)


def test_determinism_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
