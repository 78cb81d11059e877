"""ulp-autotuned: the paged forward over the subject's own split against its dense forward, each call tuned by the
subject's own autotuner: bit-identical, or within the rounding bound derived in harness.checks.ulp_autotuned from
the arithmetic of the kernel, never fitted; beyond it, differs. Sparsity mode "none" only."""

from harness import checks

CHECK = checks.ULP_AUTOTUNED  # its declaration: what it needs, costs and draws


def test_ulp_autotuned(conformance, target):
    conformance.run(target, CHECK)


def test_ulp_autotuned_regression(conformance, regression):
    conformance.replay(regression, CHECK)
