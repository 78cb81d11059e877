"""What a run's items check: targets (a release and one of its geometries; an attention layer of a whole model
where the model hands it views its geometry does not have; or what a check's implementation makes its own:
harness.checks), the seed and the number of examples of each item, and the order items run in."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import torch

from harness.checks import Check
from harness.contract import Contract, Dims
from harness.draws.cases import SPARSITY_MODES
from harness.draws.strategies import Sizes
from harness.handed.layer import Layer
from harness.handed.model import LayerView, contracted, models
from harness.run.releases import ReleaseContracts
from harness.run.session import Session, layer_of


@dataclass(frozen=True)
class Target:
    """One release and one of its geometries; `label` names a check that uses no cache (the oracle's "dense"),
    `mode` the one sparsity mode its cases take (any when empty). A check's own kind of target (harness.checks) is a
    subclass, or any frozen dataclass with `release`, `mode`, `geometry`, `described` and `id`."""

    release: ReleaseContracts
    contract: Contract
    label: str = ""
    mode: str = ""

    @property
    def geometry(self) -> str:
        """The geometry's name in result lines."""
        return self.label or self.contract.name

    @property
    def id(self) -> str:
        """Its pytest id: release, geometry and the one sparsity mode it takes."""
        return "-".join(filter(None, (self.release.release, self.geometry, self.mode)))

    @cached_property
    def described(self) -> dict[str, object]:
        """What its result lines say of the geometry: the backends that hand it in this release, its cache dtype,
        family, physical order and layer arrangement (nothing for a check that uses no cache)."""
        if self.label:
            return {}
        c = self.contract
        return dict(backends=tuple(sorted({x.origin.backend_name for x in self.release.contracts if x == c})),
                    cache_dtype=c.cache_dtype, family=c.layout.family, order=".".join(c.layout.physical),
                    layers="cross-layer" if c.layout.shared else "per-layer")

    def handed_layer(self, dims: Dims, dtype: torch.dtype) -> Layer:
        """The layer value handed with its cache at `dims`."""
        return layer_of(self.release, self.contract, dims, dtype)


@dataclass(frozen=True)
class InModel(Target):
    """An attention layer of a whole model as a release allocates it at the probe's grid of sizes, where the model
    hands it views (`views`) that its contract's allocation does not have (harness.handed.model.contracted); `also`
    the model's other layers handed views alike (`in_models`)."""

    model: str = field(kw_only=True)
    layer: str = field(kw_only=True)
    layout: str = field(kw_only=True)  # the layout the release allocated the model in
    views: tuple[LayerView, ...] = field(kw_only=True)
    also: tuple[str, ...] = field(kw_only=True, default=())

    @property
    def geometry(self) -> str:
        """Its name in result lines: `model:<model>/<layer>`."""
        return f"model:{self.model}/{self.layer}"

    @cached_property
    def described(self) -> dict[str, object]:
        """Its contract's words, with the layer's backend and the model's layout."""
        return {**super().described, "backends": (self.views[0].kv.layer.backend_name,), "order": self.layout}

    def holds(self, example: object) -> bool:
        """Whether a kept example's view is one this release hands (a release may refuse the sizes of another's)."""
        return any(v.kv.dims == example.dims and v.within == example.within for v in self.views)

    def handed_layer(self, dims: Dims, dtype: torch.dtype) -> Layer:
        """The model's layer value at `dims` (one of its views')."""
        for v in self.views:
            if v.kv.dims == dims:
                return v.kv.layer
        raise ValueError(f"{self.geometry} of vLLM {self.release.release} has no view at {dims}: its views are at "
                         f"{[v.kv.dims for v in self.views]}")


def geometries(session: Session, kernels: bool = False) -> list[Target]:
    """Every (release, geometry) of the session's backends and cache dtypes, one per distinct geometry (backends
    handing a layer the same geometry share it), K/V caches only (`outside`); diff-KV caches only where no kernel is
    launched over them (`kernels` False)."""
    return [Target(r, c) for r in session.releases
            for c in dict.fromkeys(c for c in r.contracts
                                   if session.selects(c) and not outside(c, session.sizes, kernels))]


def in_models(session: Session, kernels: bool = False) -> list[InModel]:
    """Every attention layer of each session release's recorded models whose views on the probe's grid are not all
    its contract's, one per kind of views (a model's layers handed views alike, the same strides at the same sizes,
    each at a non-zero offset or each at none, are one target: its first), of the contracts the session selects and
    a check takes (`outside`)."""
    out = []
    for r in session.releases:
        for m in models(r.release, r.allocations, r.contracts, r.recording)[0]:
            by_kind: dict[tuple, tuple[tuple[LayerView, ...], list[str]]] = {}
            for name in dict.fromkeys(v.name for v in m.grid):
                unlike = tuple(v for v in m.grid if v.name == name and not contracted(v))
                if unlike:
                    kind = tuple((v.kv.dims, v.within.view.shape, v.within.view.stride, v.within.view.offset > 0)
                                 for v in unlike)
                    by_kind.setdefault(kind, (unlike, []))[1].append(name)
            for views, names in by_kind.values():
                c = views[0].kv.contract
                if session.selects(c) and not outside(c, session.sizes, kernels):
                    out.append(InModel(r, c, model=m.name, layer=names[0], layout=m.layout, views=views,
                                       also=tuple(names[1:])))
    return out


def outside(c: Contract, sizes: Sizes, kernels: bool = False) -> str:
    """Why no item of a check (one that launches the subject's kernels: `kernels`) takes geometry `c`; "" when one
    does."""
    if c.layout.latent:
        return "a latent (MLA) cache holds no K/V pair for a K/V subject to split"
    if c.diff_kv and kernels:
        drawn = " or ".join(f"K {k} / V {v}" for k, v in sizes.diff_kv_dims)
        return (f"the subject's forwards take one head size for K and V, while a diff-KV cache has two (its examples "
                f"draw head sizes {drawn}): no forward check takes it")
    return ""


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
