"""A whole model's KV caches as one release allocates them, rebuilt from the probe's record of it
(harness.probe.allocation): each allocation a byte buffer, each layer's view into it at its recorded shape, byte
strides and offset, and which kernel blocks (the blocks of a layer's view) make up each manager block (the
scheduler's block, which the block ids a KV connector gets count); and each attention layer's view in the same model
allocated at each size of the probe's grid (`LayerView`, what the kernel checks draw).

The model-transfer check (harness.checks.model_transfer) hands a connector what vLLM hands one: the allocation's KV
cache config (`CacheConfig`, read off the record: its groups with their specs' class names and block sizes, its
tensors with the layers sharing each), a layer value for each attention layer holding K and V
(harness.handed.layer.Layer, whose `block_size` is the kernel block's and `manager_block_size` the manager block's),
then every tensor `register_kv_caches` receives, in the release's form: attention K/V, a Mamba layer's states (one
tensor, or a list of them up to vLLM 0.26), latent and indexer caches; then block ids, one tensor per group.
"""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass, replace
from functools import cache
from typing import Any

import torch

from harness import vllm_api
from harness.contract import Contract, ContractError, Dims, views
from harness.handed.layer import Layer, layer_for
from harness.probe.models import HEAD_DIM, HEADS, MODELS
from harness.probe.observe import MODEL_DTYPE
from harness.recordings import allocations

POISON = -1  # the byte a fresh allocation holds: 0xFF, NaN in every float view of it


@dataclass(frozen=True)
class KV:
    """What an attention layer holding K and V is besides its tensor: its layer value, its contract and sizes."""

    layer: Layer
    contract: Contract  # the release's contract of its backend under the model's layout
    dims: Dims  # its sizes: kernel blocks, kernel block size, heads, head size, and its place among the layers


@dataclass(frozen=True)
class LayerView:
    """An attention layer holding K and V in a model allocated at one size of the probe's grid: its layer value,
    contract and sizes, and its view within its allocation (the other bytes of which are other layers')."""

    name: str
    kv: KV
    within: views.InAllocation


@dataclass(frozen=True)
class Handed:
    """One name `register_kv_caches` receives: its group, its recorded views (one tensor; a Mamba layer's states up
    to vLLM 0.26: a list of them), the axis of its blocks and the kernel blocks of each manager block."""

    name: str
    group: int
    views: tuple[dict[str, Any], ...]  # harness.probe.allocation.view_bytes: allocation, shape, strides, offset, dtype
    listed: bool  # handed as a list of tensors
    block_axis: int
    kernel_blocks: tuple[tuple[int, ...], ...]  # per manager block, the kernel blocks it holds
    kv: KV | None  # an attention layer holding K and V; None for Mamba states, latent and indexer caches


@dataclass(frozen=True)
class CacheSpec:
    """A group's KV cache spec as a connector reads it off vLLM's KVCacheConfig; each recorded kind is a subclass
    named as vLLM's class (`spec_class`), so that `type(spec).__name__` reads the same in replay."""

    block_size: int  # the manager block's tokens
    page_size_bytes: int


@dataclass(frozen=True)
class CacheGroup:
    """vLLM's KVCacheGroupSpec: the layers of one group and their spec."""

    layer_names: tuple[str, ...]
    kv_cache_spec: CacheSpec


@dataclass(frozen=True)
class CacheTensor:
    """vLLM's KVCacheTensor: one allocation's size in bytes and the layers that share it."""

    size: int
    shared_by: tuple[str, ...]


@dataclass(frozen=True)
class CacheConfig:
    """vLLM's KVCacheConfig as the probe recorded it, its field names vLLM's."""

    num_blocks: int
    kv_cache_tensors: tuple[CacheTensor, ...]
    kv_cache_groups: tuple[CacheGroup, ...]


@cache
def spec_class(name: str) -> type[CacheSpec]:
    """The stand-in of vLLM's KV cache spec class `name` (FullAttentionSpec, MambaSpec, ...)."""
    return make_dataclass(name, [], bases=(CacheSpec,), frozen=True)


@dataclass(frozen=True)
class Model:
    """One model configuration as one release allocates it: its allocations' sizes in bytes, its KV cache config
    and every name a KV connector is handed."""

    release: str
    name: str
    layout: str  # the layout the release allocated it in (a KVCacheLayout name, or NHD/HND)
    num_blocks: int  # manager blocks
    allocations: tuple[int, ...]
    handed: tuple[Handed, ...]
    config: CacheConfig
    grid: tuple[LayerView, ...] = ()  # its K/V layers' views at the probe's grid of sizes

    @property
    def kv(self) -> tuple[Handed, ...]:
        """The attention layers holding K and V."""
        return tuple(h for h in self.handed if h.kv is not None)

    @property
    def layers(self) -> dict[str, Layer]:
        """The attention layers' values by name, as a connector is handed them."""
        return {h.name: h.kv.layer for h in self.kv}

    @property
    def geometry(self) -> str:
        """Its name in result lines and item ids."""
        return f"model:{self.name}"

    @property
    def contract(self) -> Contract:
        """The geometry of the K/V layers it hands (the release's contract of the first one's backend)."""
        return self.kv[0].kv.contract


def models(release: str, record: dict[str, Any] | None, contracts: tuple[Contract, ...], recording=None
           ) -> tuple[list[Model], dict[str, str]]:
    """The models of a release's allocation record whose layers a connector is handed, one of them K/V, and why each
    other model (or the whole release) is not taken. `recording`: the replayed release's (its stand-in backend
    classes)."""
    if not record or not record.get("read"):
        why = record.get("why", "not read") if record else "no allocation record"
        return [], {"*": f"the whole-model allocation was not read for vLLM {release}: {why}"}
    taken, outside = [], {}
    for name, body in record["models"].items():
        try:
            taken.append(model(release, name, body, contracts, recording))
        except Outside as e:
            outside[name] = str(e)
    return taken, outside


class Outside(Exception):
    """Why a recorded model is not one the connector check takes."""


def model(release: str, name: str, body: dict[str, Any], contracts: tuple[Contract, ...], recording=None) -> Model:
    """One recorded model, its K/V layers' values made from the release's contracts; Outside where it has none."""
    for kind in ("refused", "raised"):
        if kind in body:
            raise Outside(f"vLLM {release} {kind} it at {body[kind]['step']}: {body[kind]['error']}")
    if "absent" in body:
        raise Outside(body["absent"])
    if body.get("cross_layer_tensor"):
        raise Outside("the connector is handed one cross-layer tensor (register_cross_layers_kv_cache), not the "
                      "layers' views")
    spec = next((m for m in MODELS if m.name == name), None)
    if spec is None:
        raise Outside(f"not a model kvconform defines ({', '.join(m.name for m in MODELS)})")
    cross = allocations.interleaved(body["layers"])
    handed, others = [], []
    for layer_name, rec in body["layers"].items():
        kv, what = None, body["groups"][rec["group"]]["spec"]
        backend = spec.layers[layer_name].backend
        if isinstance(backend, str) and not isinstance(rec["layer"], list):
            contract = _contract(contracts, backend, spec.cache_dtype, body["layout"], cross)
            if contract is None:
                raise ContractError(f"vLLM {release} model {name}: no recorded contract of {backend} at "
                                    f"{spec.cache_dtype} under layout {body['layout']}"
                                    f"{' cross-layer' if cross else ''} describes its layer {layer_name}")
            if contract.layout.latent:
                what = f"latent {backend}"
            else:
                kv = _kv(release, layer_name, rec, contract, backend, body["layout"], len(body["layers"]), cross,
                         recording)
        if kv is None:
            others.append(f"{layer_name} ({what})")
        listed = isinstance(rec["layer"], list)
        handed.append(Handed(layer_name, rec["group"], tuple(rec["layer"]) if listed else (rec["layer"],), listed,
                             rec["block_axis"], tuple(tuple(b) for b in rec["kernel_blocks"]), kv))
    if len(others) == len(handed):
        raise Outside(f"none of its layers holds K and V ({', '.join(others)})")
    kv = {h.name: h.kv for h in handed if h.kv is not None}
    grid = tuple(LayerView(layer_name, _kv(release, layer_name, rec, kv[layer_name].contract,
                                          spec.layers[layer_name].backend, body["layout"], len(body["layers"]), cross,
                                          recording, at), _within(rec["layer"], at["allocations"]))
                 for at in body.get("instances", ()) if "layers" in at
                 for layer_name, rec in at["layers"].items() if layer_name in kv)
    return Model(release, name, body["layout"], body["num_blocks"], tuple(body["allocations"]), tuple(handed),
                 config(body), grid)


def _within(view: dict[str, Any], allocations: list[int]) -> views.InAllocation:
    size = getattr(torch, view["dtype"]).itemsize
    return views.InAllocation(views.View(tuple(view["shape"]), tuple(s // size for s in view["stride_bytes"]),
                                         view["offset_bytes"] // size), allocations[view["allocation"]])


def contracted(v: LayerView) -> bool:
    """Whether the model hands `v` as its contract lays a layer's cache out (allocated as a check allocates it, in
    its physical order): at its sizes, the same strides (of the axes longer than 1) and offset. A kernel that takes
    strides from what the layer's backend declares is right on a contract's caches; on a view where this is False
    only one that reads the tensor's own strides is."""
    want = v.within.view
    got = views.View.of(views.allocate(v.kv.contract, v.kv.dims, MODEL_DTYPE, "meta"))
    return got.offset == want.offset and all(k == 1 or a == b for k, a, b in zip(want.shape, got.stride, want.stride))


def config(body: dict[str, Any]) -> CacheConfig:
    """A recorded model's KV cache config."""
    return CacheConfig(body["num_blocks"],
                       tuple(CacheTensor(t["size"], tuple(t["layers"])) for t in body["tensors"]),
                       tuple(CacheGroup(tuple(g["layers"]), spec_class(g["spec"])(
                           g["manager_block_size"], g["page_size_padded"] or g["page_size_bytes"]))
                             for g in body["groups"]))


def standing_in(c) -> CacheConfig:
    """What the recorded stand-in holds of KV cache config `c` (vLLM's own, or a stand-in)."""
    return CacheConfig(c.num_blocks, tuple(CacheTensor(t.size, tuple(t.layers if hasattr(t, "layers") else t.shared_by))
                                           for t in c.kv_cache_tensors),
                       tuple(CacheGroup(tuple(g.layer_names), spec_class(type(g.kv_cache_spec).__name__)(
                           g.kv_cache_spec.block_size, getattr(g.kv_cache_spec, "page_size_padded", None)
                           or g.kv_cache_spec.page_size_bytes)) for g in c.kv_cache_groups))


def agreeing(m: Model, own):
    """`own` (the installed release's KV cache config of model `m`), where it reads as the recorded one: the
    tensors a connector is handed are rebuilt from the record; ContractError naming both where they differ."""
    if standing_in(own) != m.config:
        raise ContractError(f"vLLM {m.release} model {m.name}: the installed release's KV cache config "
                            f"{standing_in(own)} is not the recorded {m.config}")
    return own


def _kv(release: str, name: str, rec: dict[str, Any], contract: Contract, backend: str, layout: str,
        num_layers: int, cross: bool, recording, at: dict[str, Any] | None = None) -> KV:
    """A K/V layer's value, contract and sizes from its record: at the recorded sizes, or `at` (an instance of the
    grid, whose record names no block axis: the contract's says it)."""
    view = rec["layer"]
    index = int(name.split(".")[1]) if cross else 0
    axis = contract.layout.logical.index("B") if at else rec["block_axis"]
    heads, head_dim = (at["heads"], at["head_dim"]) if at else (HEADS, HEAD_DIM)
    dims = Dims(view["shape"][axis], rec["kernel_block_size"] or rec["manager_block_size"], heads, head_dim,
                num_layers if cross else 1, index)
    cls = vllm_api.backend_class(recording or release, backend)
    layer = replace(layer_for(contract, dims, MODEL_DTYPE, cls, release, recording),
                    kv_cache_layout=layout, manager_block_size=rec["manager_block_size"])
    # The recorded view must have the contract's logical shape (a harness that matched the wrong contract says
    # so); its memory order may differ from the backend's stated one: that is what the whole-model level adds.
    want = [views.size(contract, a, dims) for a in contract.layout.logical]
    if view["shape"] != want:
        raise ContractError(f"vLLM {release} layer {name}'s recorded view {view['shape']} is not the logical shape "
                            f"{want} of {contract.describe()} at {dims}")
    return KV(layer, contract, dims)


def _contract(contracts: tuple[Contract, ...], backend: str, cache_dtype: str, layout: str, cross: bool
              ) -> Contract | None:
    """The release's contract of `backend` at `cache_dtype` read under layout setting `layout` (a KVCacheLayout
    member, or NHD/HND as VLLM_KV_CACHE_LAYOUT spells it) for one layer's or for interleaved layers' caches."""
    for c in contracts:
        if c.origin.backend_name != backend or c.cache_dtype != cache_dtype:
            continue
        for part in c.origin.setting.split(" + "):
            words = part.split()
            if words and words[0].split("=")[-1] == layout and ("cross-layer" in words) == cross:
                return c
    return None


def allocated(sizes: tuple[int, ...], device: str | torch.device) -> list[torch.Tensor]:
    """Byte buffers of `sizes`, every byte POISON."""
    return [torch.full((n,), POISON, dtype=torch.int8, device=device) for n in sizes]


def tensors(h: Handed, buffers: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The views `h` is handed, into `buffers` (a model's allocations); ContractError for a recorded view its element
    size does not align."""
    out = []
    for v in h.views:
        dtype = getattr(torch, v["dtype"])
        size = dtype.itemsize
        if any(x % size for x in (*v["stride_bytes"], v["offset_bytes"])):
            raise ContractError(f"layer {h.name}: recorded byte strides {v['stride_bytes']} and offset "
                                f"{v['offset_bytes']} are not whole {v['dtype']} elements")
        flat = buffers[v["allocation"]].view(dtype)
        out.append(flat.as_strided(v["shape"], [s // size for s in v["stride_bytes"]], v["offset_bytes"] // size))
    return tuple(out)


def kv_caches(m: Model, buffers: list[torch.Tensor]) -> dict[str, torch.Tensor | list[torch.Tensor]]:
    """What `register_kv_caches` receives for model `m` allocated in `buffers`: each name's tensor (or list)."""
    return {h.name: list(ts) if h.listed else ts[0] for h in m.handed for ts in [tensors(h, buffers)]}


def handed_tensors(h: Handed, kv_caches: dict[str, torch.Tensor | list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """`h`'s tensors among what was registered (read back through them: registration may re-point their storage)."""
    got = kv_caches[h.name]
    return tuple(got) if h.listed else (got,)


def kernel_block(t: torch.Tensor, h: Handed, k: int) -> torch.Tensor:
    """Kernel block `k` of layer `h`'s view `t`."""
    return t.select(h.block_axis, k)
