"""What vLLM gives one attention layer (or a connector registering its caches) in a release: the value subjects
receive in place of kvconform's contract. A subject decides the layout from it as it would inside vLLM: by asking
`layer.backend` (live: vLLM's class; replay: the recorded stand-in, harness.vllm_api), never by reading kvconform's
answer. While a subject is called with a layer, `in_force(layer)` holds: the layout setting is set as the release
reads it (VLLM_KV_CACHE_LAYOUT before the KVCacheLayout enum), and in replay `import vllm...` gets the release's
stand-in modules.

`contract_of(layer)` is kvconform's model of the layout the layer's backend API states: how kvconform's own
subjects read a layer (a consumer of the API, like any other); the checks judge every subject against the contract
the release was probed to hand out, not against this.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from harness.backends import BACKENDS, LAYOUT_ENV, LAYOUT_VALUES, backend_named, layout_env
from harness.contract import Contract, ContractError, Dims, views
from harness.probe.era_stride import asked_shape
from harness.probe.observe import axes, patched
from harness.recordings.store import Recording
from harness.vllm_api import replaying

ENUM_AXES = ("L", "B", "H", "N", "C")  # the axes KVCacheLayout's member names and stride orders spell


@dataclass(frozen=True)
class Layer:
    """One layer's cache as its release describes it (kv_cache itself is handed beside it)."""

    release: str  # the vLLM release, as `vllm.__version__` spells it
    backend: type  # the attention backend class that allocated the cache
    cache_dtype: str  # the `kv_cache_dtype` setting, as the release spells it ("auto", "fp8_e4m3", "nvfp4", ...)
    dtype: torch.dtype  # the model dtype
    block_size: int  # tokens per block of the layer's view (a kernel block)
    num_kv_heads: int
    head_size: int
    head_size_v: int  # V's head size: head_size except on the diff-KV backends
    kv_cache_layout: str | None = None  # the setting in force: "NHD"/"HND", a KVCacheLayout name, None when unset
    cross_layer: bool = False  # the cache is one layer's view of an allocation the layers share (KV connectors')
    num_layers: int = 1  # layers in that allocation
    layer_index: int = 0  # this layer's place in it
    manager_block_size: int = 0  # tokens per block the scheduler's block ids count (a manager block); 0: block_size
    recording: Recording | None = field(default=None, compare=False, repr=False)  # replay: stand-ins' source

    def __post_init__(self) -> None:
        if not self.manager_block_size:
            object.__setattr__(self, "manager_block_size", self.block_size)
        if self.manager_block_size % self.block_size:
            raise ValueError(f"manager block size {self.manager_block_size} is not a whole number of kernel blocks "
                             f"of {self.block_size} tokens")

    @property
    def backend_name(self) -> str:
        """The backend's name as it gives it (`get_name()`)."""
        return self.backend.get_name()

    def describe(self) -> str:
        setting = f" {LAYOUT_ENV if self.kv_cache_layout in LAYOUT_VALUES else 'layout'}={self.kv_cache_layout}" \
            if self.kv_cache_layout else ""
        layers = f", layer {self.layer_index} of {self.num_layers} in one allocation" if self.cross_layer else ""
        if self.manager_block_size != self.block_size:
            layers += f", manager blocks of {self.manager_block_size} tokens"
        return (f"vLLM {self.release} {self.backend_name}{setting}, kv_cache_dtype {self.cache_dtype}, block_size "
                f"{self.block_size}, {self.num_kv_heads} KV heads, head size {self.head_size}"
                + (f"/{self.head_size_v}" if self.head_size_v != self.head_size else "") + layers)


def setting_of(contract: Contract) -> tuple[str | None, bool]:
    """The layout setting (see Layer.kv_cache_layout) and whether the allocation was cross-layer, from the first
    setting a recorded contract was read under ("VLLM_KV_CACHE_LAYOUT=HND", "VLLM_KV_CACHE_LAYOUT=NHD cross-layer",
    "LBHNC single-layer (sm90)", "default"; recordings of an older spelling: "NHD cross-layer")."""
    words = contract.origin.setting.split(" + ")[0].split()
    layout = None
    for w in words:
        if w.startswith(f"{LAYOUT_ENV}="):
            layout = w.split("=", 1)[1]
        elif w in LAYOUT_VALUES or (len(w) == len(ENUM_AXES) and set(w) == set(ENUM_AXES)):
            layout = w
        elif w not in ("default", "single-layer", "cross-layer") and not (w.startswith("(sm") and w.endswith(")")):
            raise ContractError(f"recorded setting {contract.origin.setting!r} of {contract.name} "
                                f"(from {contract.origin}): unknown word {w!r}")
    return layout, "cross-layer" in words


def layer_for(contract: Contract, dims: Dims, dtype: torch.dtype, backend: type, release: str,
              recording: Recording | None) -> Layer:
    """The layer a release hands a cache of `contract` at `dims`, from the backend the contract was read from."""
    layout, cross = setting_of(contract)
    return Layer(release, backend, contract.cache_dtype, dtype, dims.block_size, dims.kv_heads, dims.head_dim,
                 dims.v_dim, layout, cross, dims.num_layers, dims.layer, recording=recording)


@contextlib.contextmanager
def in_force(layer: Layer) -> Iterator[None]:
    """The layer's release as a subject inside vLLM would meet it: its layout setting in the environment (vLLM's
    cached read of it cleared, live), V's head size on a diff-KV backend's class, and in replay the release's
    stand-in `vllm` modules importable."""
    with contextlib.ExitStack() as stack:
        if layer.recording is not None:
            stack.enter_context(replaying(layer.recording))
        stack.enter_context(layout_env(layer.kv_cache_layout if layer.kv_cache_layout in LAYOUT_VALUES else None))
        if hasattr(layer.backend, "head_size_v"):
            stack.enter_context(patched(layer.backend, "head_size_v", layer.head_size_v))
        yield


def contract_of(layer: Layer) -> Contract:
    """kvconform's model of the layout `layer.backend` states for this layer, asked as a consumer asks: the logical
    axes from `get_kv_cache_shape` at sentinel sizes (the probe's, whose axis sizes all differ), the memory order
    from `get_kv_cache_stride_order` where the release has it; from the KVCacheLayout enum, the logical view
    [B, H, N, C] and the order the layout's member spells. ContractError when the backend states neither."""
    name = layer.backend_name.removesuffix("_VLLM_V1")
    b = backend_named(name)
    if b is None:
        raise ContractError(f"{layer.describe()}: backend {name} is not one kvconform models; known: "
                            f"{', '.join(x.name for x in BACKENDS)}")
    origin = f"vllm {layer.release} {layer.backend_name} {layer.kv_cache_layout or 'default'}" + (
        " cross-layer" if layer.cross_layer else "")
    with in_force(layer):
        cls = layer.backend
        if callable(getattr(cls, "get_kv_cache_shape", None)):
            logical = axes(b, layer.cache_dtype, asked_shape(b, cls, layer.cache_dtype), "get_kv_cache_shape")
            physical = _stride_ordered(cls, logical, layer.cross_layer)
        elif layer.kv_cache_layout and len(layer.kv_cache_layout) == len(ENUM_AXES):
            # An NVFP4 spec (FlashInfer's customize_spec, which the stand-ins do not model) keeps K and V as heads
            # of their own: the view [B, 2H, N, D], in the order the member spells for H and C.
            spelled = ("L", "B", "S", "N", "D") if layer.cache_dtype == "nvfp4" else ENUM_AXES
            logical = spelled[1:]
            member = _layout_member(layer)
            physical = tuple(spelled[i] for i in member.stride_order if layer.cross_layer or i != 0)
        else:
            raise ContractError(f"{layer.describe()}: the backend has no get_kv_cache_shape and no KVCacheLayout is "
                                "in force: its layout cannot be asked")
    return Contract.of(logical, physical, origin, layer.cache_dtype, b.diff_kv)


def _stride_ordered(cls: type, logical: tuple[str, ...], cross_layer: bool) -> tuple[str, ...]:
    axes = ("L", *logical) if cross_layer else logical
    fn = getattr(cls, "get_kv_cache_stride_order", None)
    if fn is None:
        return axes
    try:
        order = tuple(fn(include_num_layers_dimension=True) if cross_layer else fn())
    except NotImplementedError:
        return axes
    if sorted(order) != list(range(len(axes))):
        raise ContractError(f"{cls.__name__}.get_kv_cache_stride_order() returned {order} for axes {'.'.join(axes)}")
    return tuple(axes[i] for i in order)


def _layout_member(layer: Layer):
    enum = importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout
    try:
        return enum[layer.kv_cache_layout]
    except KeyError:
        raise ContractError(f"{layer.describe()}: KVCacheLayout has no member {layer.kv_cache_layout}; it has "
                            f"{', '.join(m.name for m in enum)}") from None


def kv_views(kv_cache: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V views [B, N, H, D] of `layer`'s kv_cache, laid out as `contract_of(layer)`; ContractError naming the
    tensor's shape and that layout for a tensor not of it."""
    c = contract_of(layer)
    return views.split(c, kv_cache, dims_of(c, kv_cache, layer))


def dims_of(c: Contract, kv_cache: torch.Tensor, layer: Layer) -> Dims | None:
    """The sizes of `layer`'s kv_cache laid out as `c`: its blocks from the tensor, the rest from the layer (None
    for a tensor of another rank)."""
    if kv_cache.dim() != len(c.layout.logical):
        return None
    return Dims(kv_cache.shape[c.layout.logical.index("B")], layer.block_size, layer.num_kv_heads, layer.head_size,
                layer.num_layers, layer.layer_index, 0 if layer.head_size_v == layer.head_size else layer.head_size_v)
