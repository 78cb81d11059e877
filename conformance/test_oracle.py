"""oracle: the subject's dense forward agrees with the float64 oracle (harness.compare.reference), under the sparsity
semantics the subject declares, within 2 * eps(dtype) * max|v| around the envelope of its decision paths
(harness.checks.oracle derives the tolerance). Once per session, under its newest release, in each sparsity mode."""

from harness import checks

CHECK = checks.ORACLE  # its declaration: what it needs, costs and draws


def test_oracle(conformance, target):
    conformance.run(target, CHECK)


def test_oracle_regression(conformance, regression):
    conformance.replay(regression, CHECK)
