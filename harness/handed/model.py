"""A whole model's KV caches as one release allocates them, rebuilt from the probe's record of it
(harness.probe.allocation): each allocation a byte buffer, each layer's view into it at its recorded shape, byte
strides and offset, and which kernel blocks (the blocks of a layer's view) make up each manager block (the
scheduler's block, which the block ids a KV connector gets count).

The model-transfer check (harness.checks.model_transfer) hands a subject what `register_kv_caches` receives,
the layers' views by name, with a layer value for each (harness.handed.layer.Layer, whose `block_size` is the kernel
block's and `manager_block_size` the manager block's), then manager block ids. Only attention layers holding K
and V are handed: a Mamba layer's states and latent or indexer caches are not K/V. Their bytes still count: a move
leaves every byte outside the moved kernel blocks of the handed layers as it was, where groups overlay each other
and layers share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
class Handed:
    """One layer a connector is handed: its name, its layer value, its recorded view and its kernel blocks."""

    name: str
    layer: Layer
    view: dict[str, Any]  # harness.probe.allocation.view_bytes: allocation, shape, stride_bytes, offset_bytes, dtype
    block_axis: int
    kernel_blocks: tuple[tuple[int, ...], ...]  # per manager block, the kernel blocks it holds
    contract: Contract  # the release's contract of its backend under the model's layout
    dims: Dims  # its sizes: kernel blocks, kernel block size, heads, head size, and its place among the layers


@dataclass(frozen=True)
class Model:
    """One model configuration as one release allocates it: its allocations' sizes in bytes and the layers a K/V
    connector is handed."""

    release: str
    name: str
    layout: str  # the layout the release allocated it in (a KVCacheLayout name, or NHD/HND)
    num_blocks: int  # manager blocks
    allocations: tuple[int, ...]
    handed: tuple[Handed, ...]

    @property
    def geometry(self) -> str:
        """Its name in result lines and item ids."""
        return f"model:{self.name}"

    @property
    def contract(self) -> Contract:
        """The geometry of the layers it hands (the release's contract of the first one's backend)."""
        return self.handed[0].contract


def models(release: str, record: dict[str, Any] | None, contracts: tuple[Contract, ...], recording=None
           ) -> tuple[list[Model], dict[str, str]]:
    """The models of a release's allocation record that hand a connector K/V layers, and why each other model (or
    the whole release) is not taken. `recording`: the replayed release's (its stand-in backend classes)."""
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
    """Why a recorded model is not one a K/V connector check takes."""


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
    handed, unhanded = [], []
    for layer_name, rec in body["layers"].items():
        backend = spec.layers[layer_name].backend
        if not isinstance(backend, str) or isinstance(rec["layer"], list):
            unhanded.append(f"{layer_name} ({body['groups'][rec['group']]['spec']})")
            continue
        contract = _contract(contracts, backend, spec.cache_dtype, body["layout"], cross)
        if contract is None:
            raise ContractError(f"vLLM {release} model {name}: no recorded contract of {backend} at "
                                f"{spec.cache_dtype} under layout {body['layout']}"
                                f"{' cross-layer' if cross else ''} describes its layer {layer_name}")
        if contract.layout.latent:
            unhanded.append(f"{layer_name} (latent {backend})")
            continue
        handed.append(_handed(release, layer_name, rec, contract, backend, body["layout"], len(body["layers"]), cross,
                              tuple(body["allocations"]), recording))
    if not handed:
        raise Outside(f"none of its layers holds K and V ({', '.join(unhanded)})")
    return Model(release, name, body["layout"], body["num_blocks"], tuple(body["allocations"]), tuple(handed))


def _handed(release: str, name: str, rec: dict[str, Any], contract: Contract, backend: str, layout: str,
            num_layers: int, cross: bool, sizes: tuple[int, ...], recording) -> Handed:
    view = rec["layer"]
    index = int(name.split(".")[1]) if cross else 0
    dims = Dims(view["shape"][rec["block_axis"]], rec["kernel_block_size"], HEADS, HEAD_DIM,
                num_layers if cross else 1, index)
    cls = vllm_api.backend_class(recording or release, backend)
    layer = replace(layer_for(contract, dims, MODEL_DTYPE, cls, release, recording),
                    kv_cache_layout=layout, manager_block_size=rec["manager_block_size"])
    h = Handed(name, layer, view, rec["block_axis"], tuple(tuple(b) for b in rec["kernel_blocks"]), contract, dims)
    # The recorded view must have the contract's logical shape (a harness that matched the wrong contract says
    # so); its memory order may differ from the backend's stated one: that is what the whole-model level adds.
    want = [views.size(contract, a, dims) for a in contract.layout.logical]
    if view["shape"] != want:
        raise ContractError(f"vLLM {release} layer {name}'s recorded view {view['shape']} is not the logical shape "
                            f"{want} of {contract.describe()} at {dims}")
    return h


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


def tensor(h: Handed, buffers: list[torch.Tensor]) -> torch.Tensor:
    """The view layer `h` is handed, into `buffers` (a model's allocations); ContractError for a recorded view its
    element size does not align."""
    v = h.view
    dtype = getattr(torch, v["dtype"])
    size = dtype.itemsize
    if any(x % size for x in (*v["stride_bytes"], v["offset_bytes"])):
        raise ContractError(f"layer {h.name}: recorded byte strides {v['stride_bytes']} and offset "
                            f"{v['offset_bytes']} are not whole {v['dtype']} elements")
    flat = buffers[v["allocation"]].view(dtype)
    return flat.as_strided(v["shape"], [s // size for s in v["stride_bytes"]], v["offset_bytes"] // size)


def kv_caches(m: Model, buffers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """What `register_kv_caches` receives for model `m` allocated in `buffers`: each handed layer's view by name."""
    return {h.name: tensor(h, buffers) for h in m.handed}


def kernel_block(t: torch.Tensor, h: Handed, k: int) -> torch.Tensor:
    """Kernel block `k` of layer `h`'s view `t`."""
    return t.select(h.block_axis, k)


def owner(m: Model, allocation: int, byte: int) -> tuple[str, str]:
    """What byte `byte` of allocation `allocation` is: the handed layer's kernel block and manager block that hold
    it, or no handed layer's view; and the same as a REPRO's `where`."""
    for h in m.handed:
        v = h.view
        if v["allocation"] != allocation:
            continue
        size = getattr(torch, v["dtype"]).itemsize
        starts = torch.arange(m.allocations[allocation]).as_strided(v["shape"], v["stride_bytes"], v["offset_bytes"])
        hit = ((starts <= byte) & (byte < starts + size)).nonzero()
        if hit.numel():
            k = int(hit[0][h.block_axis])
            manager = next(i for i, ks in enumerate(h.kernel_blocks) if k in ks)
            return (f"layer {h.name}'s kernel block {k}, in manager block {manager}",
                    f"layer={h.name} block={manager} kernel_block={k}")
    return "a byte of no handed layer's view (padding, or a layer not handed)", f"allocation={allocation} byte={byte}"
