"""determinism: the same inputs through the paged forward twice give the same bits (harness.checks.determinism)."""

from harness import checks

CHECK = checks.DETERMINISM  # its declaration: what it needs, costs and draws


def test_determinism(conformance, target):
    conformance.run(target, CHECK)


def test_determinism_regression(conformance, regression):
    conformance.replay(regression, CHECK)
