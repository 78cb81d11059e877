"""transfer: blocks the subject extracts from one cache and injects into a fresh cache of the same contract at other
block ids hold exactly the same K and V there, and nothing else changed (harness.checks.transfer). Every geometry
runs the explicit examples first (num_blocks 2 and 3, where the block axis is as long as a K/V axis)."""

from harness import checks

CHECK = checks.TRANSFER  # its declaration: what it needs, costs and draws


def test_transfer(conformance, target):
    conformance.run(target, CHECK)


def test_transfer_regression(conformance, regression):
    conformance.replay(regression, CHECK)
