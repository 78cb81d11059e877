"""split-agrees: the subject's own K/V split of the release's kv_cache is the contract's split, the same views of the
same memory (harness.checks.split)."""

from harness import checks

CHECK = checks.SPLIT_AGREES  # its declaration: what it needs, costs and draws


def test_split_agrees(conformance, target):
    conformance.run(target, CHECK)


def test_split_agrees_regression(conformance, regression):
    conformance.replay(regression, CHECK)
