"""The views part of a contract: allocating a layer's kv_cache poisoned, splitting it into canonical K and V (or
latent) views that alias it, and validating a tensor against the contract's geometry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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
class Geometry:
    """A contract at concrete dims: the layer's kv_cache and its canonical views (K and V; for a latent cache, the
    latent view twice)."""

    kv_cache: View
    k: View
    v: View


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with the value no write produces: NaN, or POISON_BYTE in a byte cache. Returns `t`."""
    return t.fill_(float("nan") if t.dtype.is_floating_point else POISON_BYTE)


class Views:
    """Contract's tensor operations, over its layout (Layout) and its sizes at concrete dims (Contract.size)."""

    def physical_shape(self, dims: Dims) -> tuple[int, ...]:
        """Sizes of the allocation in memory order."""
        return tuple(self.size(a, dims) for a in self.physical)

    def allocate(self, dims: Dims, dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.Tensor:
        """The layer's kv_cache for a model of dtype `dtype`: physical memory viewed logically, every element
        poisoned (NaN; in a byte cache 0xFF, which fp8 e4m3 reads as NaN)."""
        if self.dtype.element is None and not dtype.is_floating_point:
            raise ContractError(f"cannot poison a {dtype} cache; use a floating-point dtype")
        buf = torch.empty(self.physical_shape(dims), dtype=self.dtype.cache_element(dtype), device=device)
        if buf.device.type != "meta":
            poison(buf)
        axes = (("L",) if self.shared else ()) + self.logical
        view = buf.permute([self.physical.index(a) for a in axes])
        return view[dims.layer] if self.shared else view

    def geometry(self, dims: Dims, dtype: torch.dtype = torch.float16) -> Geometry:
        """Shape, strides and offsets of kv_cache and its canonical views at `dims` (no memory is touched)."""
        kv_cache = self.allocate(dims, dtype, device="meta")
        k, v = (self.latent_view(kv_cache, dims),) * 2 if self.latent else self.split(kv_cache, dims)
        return Geometry(View.of(kv_cache), View.of(k), View.of(v))

    def split(self, kv_cache: torch.Tensor, dims: Dims | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Canonical K and V views [B, N, H, Dk] and [B, N, H, Dv] aliasing `kv_cache`. A diff-KV split needs
        `dims` (the tensor does not say where K ends); a latent cache has no K/V pair."""
        self.validate(kv_cache, dims)
        if self.latent:
            raise ContractError(f"{self.describe()} holds no K/V pair; its canonical view is latent_view()")
        if self.dtype.view is not None:
            kv_cache = kv_cache.view(self.dtype.view)  # same element size: a retype, not a copy
        if self.split_axis == "KV":
            t = kv_cache.permute([self.logical.index(a) for a in ("KV",) + CANONICAL])
            return t[0], t[1]
        if self.split_axis == "S":
            t = kv_cache.permute([self.logical.index(a) for a in ("B", "N", "S", "D")])
            h = t.shape[2] // 2
            return t[:, :, :h], t[:, :, h:]
        t = kv_cache.permute([self.logical.index(a) for a in ("B", "N", "H", "C")])
        if self.diff_kv:
            if dims is None:
                raise ContractError(f"a diff-KV split needs the dims (K's head dim): {self.describe()}")
            k = self.dtype.width(dims.head_dim)
        else:
            k = t.shape[-1] // 2
        return t[..., :k], t[..., k:]

    def latent_view(self, kv_cache: torch.Tensor, dims: Dims | None = None) -> torch.Tensor:
        """The canonical latent view [B, N, R] of a latent cache."""
        self.validate(kv_cache, dims)
        if not self.latent:
            raise ContractError(f"{self.describe()} is not a latent cache; split() gives its K and V")
        if self.dtype.view is not None:
            kv_cache = kv_cache.view(self.dtype.view)
        return kv_cache.select(self.logical.index("H"), 0) if "H" in self.logical else kv_cache

    def views(self, kv_cache: torch.Tensor, dims: Dims | None = None) -> dict[str, torch.Tensor]:
        """Every canonical view by name: K and V, or the latent view."""
        if self.latent:
            return {"latent": self.latent_view(kv_cache, dims)}
        return dict(zip("KV", self.split(kv_cache, dims)))

    def validate(self, kv_cache: torch.Tensor, dims: Dims | None = None) -> None:
        """Raise ContractError unless `kv_cache` has this contract's geometry (exactly, when `dims` is given)."""
        shape, stride = tuple(kv_cache.shape), tuple(kv_cache.stride())

        def fail(reason: str) -> None:
            raise ContractError(
                f"{reason}: kv_cache shape {shape} strides {stride} dtype {kv_cache.dtype} "
                f"does not match contract {self.describe()}"
            )

        if len(shape) != len(self.logical):
            fail(f"rank {len(shape)}, expected {len(self.logical)} axes [{','.join(self.logical)}]")
        if self.dtype.element is not None and kv_cache.dtype != self.dtype.element:
            fail(f"element type {kv_cache.dtype}, expected {self.dtype.element} for cache dtype {self.cache_dtype}")
        size = dict(zip(self.logical, shape))
        if "KV" in size and size["KV"] != 2:
            fail(f"K/V axis has size {size['KV']}, expected 2")
        if "S" in size and size["S"] % 2:
            fail(f"head-slot axis S has odd size {size['S']}, expected 2*kv_heads")
        if "C" in size and not self.diff_kv and size["C"] % 2:
            fail(f"packed axis C has odd size {size['C']}, expected K's width + V's width")
        if self.logical == ("B", "H", "N", "R") and size["H"] != 1:
            fail(f"latent head axis H has size {size['H']}, expected 1")
        if dims is not None:
            for axis in self.logical:
                want = self.size(axis, dims)
                if size[axis] != want:
                    w = self.dtype.width
                    what = (f"{want} (K's width {w(dims.head_dim)} + V's width {w(dims.v_dim)})" if axis == "C"
                            else str(want))
                    fail(f"axis {axis} has size {size[axis]}, expected {what} for {dims}")
        inner = self.logical[-1]
        if size[inner] > 1 and stride[self.logical.index(inner)] != 1:
            fail(f"innermost axis {inner} has stride {stride[self.logical.index(inner)]}, expected 1")
        self._check_memory_order(dict(zip(self.logical, stride)), size, fail)
        if dims is not None:
            expected = self.allocate(dims, kv_cache.dtype if self.dtype.element is None else torch.float16,
                                     device="meta").stride()
            for axis, got, want in zip(self.logical, stride, expected):
                if size[axis] > 1 and got != want:
                    fail(f"axis {axis} has stride {got}, expected {want} for {dims}")

    def _check_memory_order(self, stride: dict[str, int], size: dict[str, int],
                            fail: Callable[[str], None]) -> None:
        # Every axis must step over all axes physically inside it; this is what a `.contiguous()` copy or
        # an ignored NHD/HND permutation breaks.
        inner_span = 1
        for axis in reversed([a for a in self.physical if a != "L"]):
            if size[axis] > 1 and stride[axis] < inner_span:
                fail(
                    f"axis {axis} has stride {stride[axis]} but the axes inside it in memory "
                    f"[{','.join(self.physical[self.physical.index(axis) + 1:])}] span {inner_span}"
                )
            if size[axis] > 1:
                inner_span = max(inner_span, stride[axis] * size[axis])
