"""model-transfer: a connector handed a whole model's caches, as vLLM's `register_kv_caches` hands them, moves exactly
the manager blocks it is asked for, and no other byte of the model's allocations changes
(harness.checks.model_transfer). Targets are the models each release's allocation record holds; the models a release
refused, or whose connector is handed something other than the layers' views, get one not-applicable line per
release."""

from harness import checks
from harness.checks.model_transfer import models_of
from harness.results import Word

CHECK = checks.MODEL_TRANSFER  # its declaration: what it needs, costs and draws


def test_model_transfer(conformance, target):
    conformance.run(target, CHECK)


def test_model_transfer_regression(conformance, regression):
    conformance.replay(regression, CHECK)


def test_model_transfer_models_not_taken(conformance, release_contracts):
    _, outside = models_of(release_contracts)
    if outside:
        said = "; ".join(f"{'the release' if m == '*' else m}: {why}" for m, why in outside.items())
        conformance.record_release(release_contracts, CHECK, Word.NOT_APPLICABLE, said)
