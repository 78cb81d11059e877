"""relayout: blocks the subject extracts under one layout setting of a release and injects under another hold the
same K and V, read through the second setting's views, or the inject is refused and the target left untouched
(harness.checks.relayout). Targets are pairs of geometries of one release, backend, cache dtype and layer
arrangement."""

from harness import checks

CHECK = checks.RELAYOUT  # its declaration: what it needs, costs and draws


def test_relayout(conformance, target):
    conformance.run(target, CHECK)


def test_relayout_regression(conformance, regression):
    conformance.replay(regression, CHECK)
