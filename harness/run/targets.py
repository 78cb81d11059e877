"""What a run's items check: targets (a release and one of its geometries, a pair of them, or a whole model as the
release allocates it), the seed and the number of examples of each item, and the order items run in."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from harness import checks
from harness.cases import SPARSITY_MODES
from harness.checks import Check
from harness.contract import Contract
from harness.matrix import version_key
from harness.model import Model, models
from harness.run.releases import ReleaseContracts
from harness.run.session import Session
from harness.strategies import Sizes


@dataclass(frozen=True)
class Target:
    """One release and one of its geometries; `label` names a check that uses no cache (the oracle's "dense"),
    `mode` the one sparsity mode its cases take (any when empty), `peer` the geometry of another layout setting of
    the same release and backend that the relayout check moves blocks into, `model` a whole model's allocation (its
    `contract` the geometry of the layers it hands a connector)."""

    release: ReleaseContracts
    contract: Contract
    label: str = ""
    mode: str = ""
    peer: Contract | None = None
    model: Model | None = None

    @property
    def geometry(self) -> str:
        """The geometry's name in result lines (a relayout's pair as `source->peer`, a model as `model:<name>`)."""
        if self.model is not None:
            return self.model.geometry
        if self.peer is not None:
            return f"{self.contract.name}->{self.peer.name}"
        return self.label or self.contract.name

    @cached_property
    def described(self) -> dict[str, object]:
        """What its result lines say of the geometry: the backends that hand it in this release, its cache dtype,
        family, physical order and layer arrangement (nothing for a check that uses no cache; a relayout's source)."""
        if self.label:
            return {}
        c = self.contract
        if self.model is not None:  # the model's layout, and the backends of the layers it hands
            return dict(backends=tuple(sorted({h.contract.origin.backend_name for h in self.model.handed})),
                        cache_dtype=c.cache_dtype, family=c.layout.family, order=self.model.layout,
                        layers="cross-layer" if c.layout.shared else "per-layer")
        return dict(backends=tuple(sorted({x.origin.backend_name for x in self.release.contracts if x == c})),
                    cache_dtype=c.cache_dtype, family=c.layout.family, order=".".join(c.layout.physical),
                    layers="cross-layer" if c.layout.shared else "per-layer")


def targets(session: Session, check: Check | None = None) -> list[Target]:
    """Every (release, geometry) of the session's backends and cache dtypes, one per distinct geometry (backends
    handing a layer the same geometry share it), K/V caches only (`outside`); diff-KV caches only for checks that
    launch no kernel (`check` None: every geometry some check takes). The relayout check's are pairs (peers)."""
    if check is checks.RELAYOUT:
        return relayout_targets(session)
    if check is checks.MODEL_TRANSFER:
        return model_targets(session)
    return [Target(r, c) for r in session.releases
            for c in dict.fromkeys(c for c in r.contracts
                                   if session.selects(c) and not outside(c, session.sizes, check))]


def relayout_targets(session: Session) -> list[Target]:
    """Pairs of geometries one release hands a layer of one backend, cache dtype and layer arrangement under two
    layout settings (VLLM_KV_CACHE_LAYOUT NHD/HND, or KVCacheLayout members): each geometry of such a group is the
    source of one pair and the target of another (the group in a cycle), a pair several backends share once."""
    out: list[Target] = []
    for r in session.releases:
        groups: dict[tuple, dict[Contract, None]] = {}
        for c in r.contracts:
            if session.selects(c) and not outside(c, session.sizes):
                groups.setdefault((c.origin.backend_name, c.cache_dtype, c.layout.shared), {})[c] = None
        pairs: dict[tuple[Contract, Contract], None] = {}
        for group in groups.values():
            ring = list(group)
            for i, c in enumerate(ring if len(ring) > 1 else ()):
                pairs.setdefault((c, ring[(i + 1) % len(ring)]), None)
        out += [Target(r, a, peer=b) for a, b in pairs]
    return out


def model_targets(session: Session) -> list[Target]:
    """Every model of each session release whose allocation hands a connector K/V layers that the session selects
    (their backends and cache dtype)."""
    return [Target(r, m.contract, model=m) for r in session.releases for m in models_of(r)[0]
            if all(session.selects(h.contract) for h in m.handed)]


def models_of(r: ReleaseContracts) -> tuple[list[Model], dict[str, str]]:
    """Release `r`'s models a connector check takes, and why each other model (or "*": the release) is not."""
    return models(r.release, r.allocations, r.contracts, r.recording)


def outside(c: Contract, sizes: Sizes, check: Check | None = None) -> str:
    """Why no item of `check` (None: of any check) takes geometry `c`; "" when one does."""
    if c.layout.latent:
        return "a latent (MLA) cache holds no K/V pair for a K/V subject to split"
    if c.diff_kv and check is not None and check.kernels:
        drawn = " or ".join(f"K {k} / V {v}" for k, v in sizes.diff_kv_dims)
        return (f"the subject's forwards take one head size for K and V, while a diff-KV cache has two (its examples "
                f"draw head sizes {drawn}): no forward check takes it")
    return ""


def dense_targets(session: Session) -> list[Target]:
    """The dense forward alone, which no release changes: once per session, under its newest release (a nox
    session holds one), one target per sparsity mode so that the float64 items run side by side."""
    newest = max((r for r in session.releases if r.contracts), key=lambda r: version_key(r.release), default=None)
    return [Target(newest, newest.contracts[0], "dense", m) for m in SPARSITY_MODES] if newest else []


def item_seed(seed: int, check: str, target: Target) -> int:
    """The seed of one item's draws: from the run's seed, the check and the (release, geometry, sparsity mode) alone,
    so that an item draws the same examples whether its release is installed or replayed, whatever the subject,
    and items of one run draw different ones."""
    key = f"{seed}|{check}|{target.release.release}|{target.geometry}|{target.mode}"
    return int(hashlib.sha1(key.encode()).hexdigest()[:16], 16)


def examples_per_item(check: Check, max_examples: int, mode: str = "") -> int:
    """Generated examples of one item of `check` (its explicit ones come on top): the check's budget under the
    profile's max_examples, shared out among the sparsity modes when its items take one mode each (the oracle's)."""
    count = check.budget(max_examples)
    return -(-count // len(SPARSITY_MODES)) if mode else count


def order(check: Check, regression: bool) -> int:
    """Where an item of `check` runs: stored regressions first, then by the check's declared order (the checks
    that launch no kernel first: a wrong split is found and shrunk cheaply before any kernel check meets it)."""
    return 0 if regression else check.order
