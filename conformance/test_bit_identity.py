"""bit-identity: the paged forward over the subject's own split of the release's kv_cache is bit-identical to its
dense forward (harness.checks.bit_identity)."""

from harness import checks

CHECK = checks.BIT_IDENTITY  # its declaration: what it needs, costs and draws


def test_bit_identity(conformance, target):
    conformance.run(target, CHECK)


def test_bit_identity_regression(conformance, regression):
    conformance.replay(regression, CHECK)
