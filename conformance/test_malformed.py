"""rejects-malformed: a malformed kv_cache given to the subject's split is refused with an exception that names the
tensor's full shape (harness.checks.malformed)."""

from harness import checks

CHECK = checks.REJECTS_MALFORMED  # its declaration: what it needs, costs and draws


def test_rejects_malformed(conformance, target):
    conformance.run(target, CHECK)


def test_rejects_malformed_regression(conformance, regression):
    conformance.replay(regression, CHECK)
