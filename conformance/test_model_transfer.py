"""A connector handed a whole model's caches, as vLLM's `register_kv_caches` hands them, moves exactly the manager
blocks it is asked for: each layer's kernel blocks of a target manager block, read through the layer's own view,
hold those of the source manager block, and no other byte of the model's allocations changed (overlaid groups,
shared layers, layers not handed, padding); extract leaves the source as it was. Block ids are the scheduler's
(manager blocks); a layer's view is indexed by kernel blocks, `layer.manager_block_size // layer.block_size` of
them per manager block where the release splits them.

Targets are the models each release's allocation record holds (harness.model); the models a release refused, or
whose connector is handed something other than the layers' views, get one not-applicable line per release.
"""

from harness import checks, transfer
from harness.results import Word
from harness.run.targets import models_of

CHECK = checks.MODEL_TRANSFER  # its declaration: what it needs, costs and draws


def check(t):
    return transfer.connector_moved(t)


def test_model_transfer(conformance, target):
    conformance.run(target, CHECK, check)


def test_model_transfer_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)


def test_model_transfer_models_not_taken(conformance, release_contracts):
    _, outside = models_of(release_contracts)
    if outside:
        said = "; ".join(f"{'the release' if m == '*' else m}: {why}" for m, why in outside.items())
        conformance.record_release(release_contracts, CHECK, Word.NOT_APPLICABLE, said)
