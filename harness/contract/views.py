"""A contract's tensors, as functions of its layout and cache dtype: the size of each axis at concrete dims, the
layer's kv_cache allocated poisoned (as the contract lays it out, or as a whole model's allocation handed it), its
canonical K and V (or latent) views aliasing it, and validating a tensor against the contract's geometry.

A release lays a contract's axes out in its physical order, and a kv-first layer's cache in a model with Mamba
layers with its blocks outside K and V (`orders`): vLLM's model runner restrides such a cache (2, num_blocks, ...)
so that one block of every layer sharing the allocation lines up (`_update_hybrid_attention_mamba_layout`,
vllm/v1/worker/gpu_model_runner.py of 0.22.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.contract import Contract
from harness.contract.layout import CANONICAL, ContractError, Dims

POISON_BYTE = 0xFF  # fills a byte cache: NaN as fp8 e4m3, an implausible value as NVFP4


@dataclass(frozen=True)
class View:
    """Shape, strides and storage offset of one tensor view, in elements."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, t: torch.Tensor) -> View:
        return cls(tuple(t.shape), tuple(t.stride()), t.storage_offset())


@dataclass(frozen=True)
class InAllocation:
    """A layer's kv_cache as a whole model's allocation hands it: its view (in elements) into an allocation of
    `nbytes` bytes, whose other bytes belong to other layers."""

    view: View
    nbytes: int

    def to_json(self) -> dict[str, object]:
        return {"shape": list(self.view.shape), "stride": list(self.view.stride), "offset": self.view.offset,
                "nbytes": self.nbytes}

    @classmethod
    def from_json(cls, body: dict[str, object]) -> InAllocation:
        return cls(View(tuple(body["shape"]), tuple(body["stride"]), body["offset"]), body["nbytes"])


@dataclass(frozen=True)
class Geometry:
    """A contract at concrete dims: the layer's kv_cache and its canonical views (K and V; for a latent cache, the
    latent view twice)."""

    kv_cache: View
    k: View
    v: View


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with the value no write produces: NaN, or POISON_BYTE in a byte cache. Returns `t`."""
    return t.fill_(float("nan") if t.dtype.is_floating_point else POISON_BYTE)


def size(c: Contract, axis: str, dims: Dims) -> int:
    """Size of one named axis of `c` at `dims`, in the cache's elements."""
    if dims.v_dim != dims.head_dim and not c.diff_kv:
        raise ContractError(f"{dims} has V head dim {dims.v_dim} != K head dim {dims.head_dim}, which "
                            f"{c.describe()} cannot hold (not a diff-KV contract)")
    if c.layout.latent and axis == "H" and dims.kv_heads != 1:
        raise ContractError(f"a latent cache has one head slot, {dims} has {dims.kv_heads}: {c.describe()}")
    w = c.dtype.width
    if axis in ("D", "R"):
        return w(dims.head_dim)
    return w(dims.head_dim) + w(dims.v_dim) if axis == "C" else dims.size(axis)


def orders(c: Contract) -> tuple[tuple[str, ...], ...]:
    """The memory orders a release lays `c` out in, outermost axis first: its physical order, and for a kv-first
    layer's cache the same with its blocks outside K and V (in a model with Mamba layers)."""
    physical = c.layout.physical
    if c.layout.shared or physical[:2] != ("KV", "B"):
        return (physical,)
    return physical, ("B", "KV", *physical[2:])


def physical_shape(c: Contract, dims: Dims, order: tuple[str, ...] | None = None) -> tuple[int, ...]:
    """Sizes of the allocation in memory order (the contract's physical one unless `order` is given)."""
    return tuple(size(c, a, dims) for a in order or c.layout.physical)


def allocate(c: Contract, dims: Dims, dtype: torch.dtype, device: str | torch.device = "cpu",
             within: InAllocation | None = None, order: tuple[str, ...] | None = None) -> torch.Tensor:
    """The layer's kv_cache for a model of dtype `dtype`: physical memory (in `order`, one of `orders(c)`; the
    physical order by default) viewed logically, or the view `within` a whole model's allocation; every element of
    the allocation poisoned (NaN; in a byte cache 0xFF, which fp8 e4m3 reads as NaN)."""
    if c.dtype.element is None and not dtype.is_floating_point:
        raise ContractError(f"cannot poison a {dtype} cache; use a floating-point dtype")
    element = c.dtype.cache_element(dtype)
    if within is not None:
        want = tuple(size(c, a, dims) for a in c.layout.logical)
        if within.view.shape != want:
            raise ContractError(f"a model's view {within.view} is not the logical shape {want} of {c.describe()} at "
                                f"{dims}")
        buf = torch.empty(within.nbytes, dtype=torch.uint8, device=device)
        if buf.device.type != "meta":
            buf.fill_(POISON_BYTE)  # NaN in every float view of it
        return buf.view(element).as_strided(within.view.shape, within.view.stride, within.view.offset)
    order = order or c.layout.physical
    if order not in orders(c):
        raise ContractError(f"memory order {order} is not one {c.describe()} is laid out in: {orders(c)}")
    buf = torch.empty(physical_shape(c, dims, order), dtype=element, device=device)
    if buf.device.type != "meta":
        poison(buf)
    layout = c.layout
    axes = (("L",) if layout.shared else ()) + layout.logical
    view = buf.permute([order.index(a) for a in axes])
    return view[dims.layer] if layout.shared else view


def geometry(c: Contract, dims: Dims, dtype: torch.dtype = torch.float16) -> Geometry:
    """Shape, strides and offsets of kv_cache and its canonical views at `dims` (no memory is touched)."""
    kv_cache = allocate(c, dims, dtype, device="meta")
    k, v = (latent_view(c, kv_cache, dims),) * 2 if c.layout.latent else split(c, kv_cache, dims)
    return Geometry(View.of(kv_cache), View.of(k), View.of(v))


def split(c: Contract, kv_cache: torch.Tensor, dims: Dims | None = None, within: InAllocation | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical K and V views [B, N, H, Dk] and [B, N, H, Dv] aliasing `kv_cache` (exactly the view `within` a
    model's allocation, where given). A diff-KV split needs `dims` (the tensor does not say where K ends); a latent
    cache has no K/V pair."""
    validate(c, kv_cache, dims, within)
    logical = c.layout.logical
    if c.layout.latent:
        raise ContractError(f"{c.describe()} holds no K/V pair; its canonical view is latent_view()")
    if c.dtype.view is not None:
        kv_cache = kv_cache.view(c.dtype.view)  # same element size: a retype, not a copy
    if c.layout.split_axis == "KV":
        t = kv_cache.permute([logical.index(a) for a in ("KV",) + CANONICAL])
        return t[0], t[1]
    if c.layout.split_axis == "S":
        t = kv_cache.permute([logical.index(a) for a in ("B", "N", "S", "D")])
        h = t.shape[2] // 2
        return t[:, :, :h], t[:, :, h:]
    t = kv_cache.permute([logical.index(a) for a in ("B", "N", "H", "C")])
    if c.diff_kv:
        if dims is None:
            raise ContractError(f"a diff-KV split needs the dims (K's head dim): {c.describe()}")
        k = c.dtype.width(dims.head_dim)
    else:
        k = t.shape[-1] // 2
    return t[..., :k], t[..., k:]


def latent_view(c: Contract, kv_cache: torch.Tensor, dims: Dims | None = None) -> torch.Tensor:
    """The canonical latent view [B, N, R] of a latent cache."""
    validate(c, kv_cache, dims)
    if not c.layout.latent:
        raise ContractError(f"{c.describe()} is not a latent cache; split() gives its K and V")
    if c.dtype.view is not None:
        kv_cache = kv_cache.view(c.dtype.view)
    return kv_cache.select(c.layout.logical.index("H"), 0) if "H" in c.layout.logical else kv_cache


def canonical(c: Contract, kv_cache: torch.Tensor, dims: Dims | None = None) -> dict[str, torch.Tensor]:
    """Every canonical view by name: K and V, or the latent view."""
    if c.layout.latent:
        return {"latent": latent_view(c, kv_cache, dims)}
    return dict(zip("KV", split(c, kv_cache, dims)))


def validate(c: Contract, kv_cache: torch.Tensor, dims: Dims | None = None, within: InAllocation | None = None
             ) -> None:
    """Raise ContractError unless `kv_cache` has the geometry of `c` in one of its memory orders (exactly, when
    `dims` is given; exactly the view `within` a model's allocation, where given)."""
    shape, stride = tuple(kv_cache.shape), tuple(kv_cache.stride())
    logical = c.layout.logical

    def fail(reason: str) -> None:
        raise ContractError(
            f"{reason}: kv_cache shape {shape} strides {stride} dtype {kv_cache.dtype} "
            f"does not match contract {c.describe()}"
        )

    if len(shape) != len(logical):
        fail(f"rank {len(shape)}, expected {len(logical)} axes [{','.join(logical)}]")
    if c.dtype.element is not None and kv_cache.dtype != c.dtype.element:
        fail(f"element type {kv_cache.dtype}, expected {c.dtype.element} for cache dtype {c.cache_dtype}")
    sizes = dict(zip(logical, shape))
    if "KV" in sizes and sizes["KV"] != 2:
        fail(f"K/V axis has size {sizes['KV']}, expected 2")
    if "S" in sizes and sizes["S"] % 2:
        fail(f"head-slot axis S has odd size {sizes['S']}, expected 2*kv_heads")
    if "C" in sizes and not c.diff_kv and sizes["C"] % 2:
        fail(f"packed axis C has odd size {sizes['C']}, expected K's width + V's width")
    if logical == ("B", "H", "N", "R") and sizes["H"] != 1:
        fail(f"latent head axis H has size {sizes['H']}, expected 1")
    if dims is not None:
        for axis in logical:
            want = size(c, axis, dims)
            if sizes[axis] != want:
                w = c.dtype.width
                what = (f"{want} (K's width {w(dims.head_dim)} + V's width {w(dims.v_dim)})" if axis == "C"
                        else str(want))
                fail(f"axis {axis} has size {sizes[axis]}, expected {what} for {dims}")
    inner = logical[-1]
    if sizes[inner] > 1 and stride[logical.index(inner)] != 1:
        fail(f"innermost axis {inner} has stride {stride[logical.index(inner)]}, expected 1")
    if within is not None:
        got = View.of(kv_cache)
        if got.shape != within.view.shape or got.offset != within.view.offset or any(
                n > 1 and a != b for n, a, b in zip(got.shape, got.stride, within.view.stride)):
            fail(f"view {got}, expected the model's view {within.view}")
        return
    wrong = [w for w in (_out_of_order(order, dict(zip(logical, stride)), sizes) for order in orders(c)) if w]
    if len(wrong) == len(orders(c)):
        fail(wrong[0])
    if dims is not None:
        dtype = kv_cache.dtype if c.dtype.element is None else torch.float16
        expected = [allocate(c, dims, dtype, device="meta", order=order).stride() for order in orders(c)]
        if not any(all(sizes[a] == 1 or got == want for a, got, want in zip(logical, stride, e)) for e in expected):
            axis, got, want = next((a, g, w) for a, g, w in zip(logical, stride, expected[0])
                                   if sizes[a] > 1 and g != w)
            fail(f"axis {axis} has stride {got}, expected {want} for {dims}")


def _out_of_order(physical: tuple[str, ...], stride: dict[str, int], sizes: dict[str, int]) -> str:
    # Every axis must step over all axes inside it in memory order `physical`; this is what a `.contiguous()` copy
    # or an ignored NHD/HND permutation breaks. The first axis that does not, in words ("": none).
    inner_span = 1
    for axis in reversed([a for a in physical if a != "L"]):
        if sizes[axis] > 1 and stride[axis] < inner_span:
            return (f"axis {axis} has stride {stride[axis]} but the axes inside it in memory "
                    f"[{','.join(physical[physical.index(axis) + 1:])}] span {inner_span}")
        if sizes[axis] > 1:
            inner_span = max(inner_span, stride[axis] * sizes[axis])
    return ""
