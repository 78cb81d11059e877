"""How one vLLM release, attention backend and cache dtype lay out a layer's paged KV cache.

Axis letters, used throughout kvconform:
  L layers (only in a shared multi-layer allocation), B blocks, KV the K/V pair (size 2), N tokens per block,
  H kv heads, S head slots (K's H heads then V's H heads), D one side's stored width, C both sides' widths packed
  (K is C[:Dk], V is C[Dk:]), R one latent row (MLA: no K/V pair).
A contract names the logical axes of the `kv_cache` tensor a layer receives, the physical order of the allocation's
axes in memory (outermost first) and the cache dtype. The split rule follows from the family. Canonical K and V
views are [B, N, H, Dk] and [B, N, H, Dv] in the cache's element type and alias the cache; a latent cache has one
canonical view [B, N, R].

A side's stored width follows from the cache dtype: the head dim for the model dtype and per-tensor fp8; the head
dim plus an inline fp32 scale (4 fp8 elements) for per-token-head fp8; for NVFP4, head_dim/2 bytes of packed fp4
plus head_dim/16 fp8 block scales, stored per page as all data then all scales (so a row is opaque bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FAMILIES: dict[tuple[str, ...], str] = {
    ("KV", "B", "N", "H", "D"): "kv-first",
    ("B", "KV", "N", "H", "D"): "blocks-first",
    ("B", "H", "N", "C"): "packed",
    ("B", "N", "H", "C"): "packed-tokens",
    ("B", "S", "N", "D"): "head-split",
    ("B", "N", "R"): "latent",
    ("B", "H", "N", "R"): "latent",
}
CANONICAL = ("B", "N", "H", "D")
POISON_BYTE = 0xFF  # fills a byte cache: NaN as fp8 e4m3, an implausible value as NVFP4


class ContractError(ValueError):
    """A layout that does not match, or cannot be expressed as, a known contract."""


@dataclass(frozen=True)
class CacheDtype:
    """How one of vLLM's `kv_cache_dtype` settings stores a side (K or V) of one token and head: the element type
    of the kv_cache a layer receives and the type its K and V views are retyped to (None: the model dtype)."""

    name: str
    element: torch.dtype | None
    view: torch.dtype | None
    scale: str  # where the dequantisation scale lives ("" when there is none)

    def width(self, head_dim: int) -> int:
        """Stored elements of one side per token and head."""
        if self.name == "fp8_per_token_head":
            return head_dim + 4
        if self.name == "nvfp4":
            if head_dim % 16:
                raise ContractError(f"an NVFP4 cache needs head_dim divisible by 16, got {head_dim}")
            return head_dim // 2 + head_dim // 16
        return head_dim


PER_TENSOR = "per tensor (the layer's k_scale / v_scale)"
CACHE_DTYPES = {c.name: c for c in (
    CacheDtype("auto", None, None, ""),
    CacheDtype("fp8_e4m3", torch.uint8, torch.float8_e4m3fn, PER_TENSOR),
    CacheDtype("fp8_e5m2", torch.uint8, torch.float8_e5m2, PER_TENSOR),
    CacheDtype("fp8_per_token_head", torch.uint8, torch.float8_e4m3fn, "inline fp32 after each side's head_dim values"),
    CacheDtype("nvfp4", torch.uint8, torch.uint8, "fp8 per 16 values, after the page's packed fp4 data"),
)}
ALIASES = {"fp8": "fp8_e4m3"}  # vLLM's `fp8` is e4m3 on CUDA


def cache_dtype(name: str) -> CacheDtype:
    """The cache dtype a vLLM `kv_cache_dtype` string names; ContractError for one kvconform cannot express."""
    try:
        return CACHE_DTYPES[ALIASES.get(name, name)]
    except KeyError:
        raise ContractError(f"unknown cache dtype {name!r}; known: {', '.join(CACHE_DTYPES)}") from None


@dataclass(frozen=True)
class Dims:
    """Concrete sizes at which a contract is instantiated (`head_dim_v` 0: V's head dim is K's)."""

    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    num_layers: int = 1
    layer: int = 0
    head_dim_v: int = 0

    def __post_init__(self) -> None:
        sizes = (self.num_blocks, self.block_size, self.kv_heads, self.head_dim, self.num_layers)
        if min(sizes) < 1 or self.head_dim_v < 0 or not 0 <= self.layer < self.num_layers:
            raise ContractError(f"invalid dims {self}")

    @property
    def v_dim(self) -> int:
        """V's head dim."""
        return self.head_dim_v or self.head_dim

    def size(self, axis: str) -> int:
        """Size of one named axis in a model-dtype cache (Contract.size for any cache dtype)."""
        return {"L": self.num_layers, "B": self.num_blocks, "KV": 2, "N": self.block_size, "H": self.kv_heads,
                "S": 2 * self.kv_heads, "D": self.head_dim, "C": self.head_dim + self.v_dim, "R": self.head_dim}[axis]


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


@dataclass(frozen=True)
class Origin:
    """Where a contract was read: the vLLM release, its attention backend, and the setting it was read under (e.g.
    `LBHNC single-layer`). Recordings keep it as one line, `vllm <release> <backend> <setting>`."""

    release: str = ""
    backend: str = ""
    setting: str = ""

    @classmethod
    def parse(cls, text: str) -> Origin:
        """The one reader of a recorded origin line; a line not of that form is all setting."""
        parts = text.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "vllm":
            return cls(parts[1], parts[2], parts[3] if len(parts) == 4 else "")
        return cls(setting=text)

    @property
    def backend_name(self) -> str:
        """The backend's name across releases: vLLM's, without the `_VLLM_V1` suffix releases before 0.11 gave it."""
        return self.backend.removesuffix("_VLLM_V1")

    def __str__(self) -> str:
        head = f"vllm {self.release} {self.backend}" if self.release else ""
        return " ".join(p for p in (head, self.setting) if p)


@dataclass(frozen=True)
class Contract:
    """Logical axes of a layer's kv_cache, the physical (memory) order of its allocation, and its cache dtype;
    `diff_kv` when V's head dim is its own (the diff-KV backends), so that C is Dk + Dv."""

    logical: tuple[str, ...]
    physical: tuple[str, ...]
    origin: Origin = field(default=Origin(), compare=False)  # a recorded line is parsed into an Origin
    cache_dtype: str = "auto"
    diff_kv: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.origin, str):
            object.__setattr__(self, "origin", Origin.parse(self.origin))
        if self.logical not in FAMILIES:
            known = ", ".join(f"{name} [{','.join(axes)}]" for axes, name in FAMILIES.items())
            raise ContractError(
                f"unknown logical layout [{','.join(self.logical)}]{self._from()}; known families: {known}"
            )
        extra = sorted(set(self.physical) - set(self.logical))
        if sorted(self.physical) != sorted(self.logical + tuple(extra)) or extra not in ([], ["L"]):
            raise ContractError(
                f"physical order [{','.join(self.physical)}] is not a permutation of the logical axes "
                f"[{','.join(self.logical)}] plus an optional L{self._from()}"
            )
        if self.physical[-1] != self.logical[-1]:
            raise ContractError(
                f"physical order [{','.join(self.physical)}] must keep {self.logical[-1]} innermost{self._from()}"
            )
        object.__setattr__(self, "cache_dtype", cache_dtype(self.cache_dtype).name)
        if self.diff_kv and "C" not in self.logical:
            raise ContractError(f"K and V head dims can differ only when they are packed in C, not in "
                                f"[{','.join(self.logical)}]{self._from()}")
        if self.diff_kv and self.cache_dtype not in ("auto", "fp8_e4m3", "fp8_e5m2"):
            raise ContractError(f"unequal K/V head dims in a {self.cache_dtype} cache are not expressible (its sides "
                                f"are padded or opaque){self._from()}")
        if self.latent and self.cache_dtype not in ("auto", "fp8_e4m3"):
            raise ContractError(f"a latent cache in {self.cache_dtype} is not expressible{self._from()}")

    @property
    def family(self) -> str:
        """kv-first, blocks-first, packed, packed-tokens, head-split or latent."""
        return FAMILIES[self.logical]

    @property
    def split_axis(self) -> str:
        """The axis K and V are taken from: KV, C, S, or R (latent: no K/V pair)."""
        return next(a for a in ("KV", "C", "S", "R") if a in self.logical)

    @property
    def packed(self) -> bool:
        """K and V are parts of the innermost axis C."""
        return self.split_axis == "C"

    @property
    def latent(self) -> bool:
        """One latent row per token, no K/V pair (MLA)."""
        return self.split_axis == "R"

    @property
    def shared(self) -> bool:
        """Several layers share one allocation (the physical order holds L)."""
        return "L" in self.physical

    @property
    def dtype(self) -> CacheDtype:
        """How the cache dtype stores a side."""
        return CACHE_DTYPES[self.cache_dtype]

    @property
    def order(self) -> str:
        """NHD when tokens sit outside heads in memory, HND otherwise."""
        heads = next(a for a in ("H", "S") if a in self.physical) if not self.logical == ("B", "N", "R") else "N"
        return "NHD" if self.physical.index("N") <= self.physical.index(heads) else "HND"

    @property
    def name(self) -> str:
        """Family, physical order, K/V head dims and cache dtype, e.g. `packed:B.H.N.C@fp8_e4m3`."""
        return (f"{self.family}:{'.'.join(self.physical)}" + ("+diffkv" if self.diff_kv else "")
                + ("" if self.cache_dtype == "auto" else f"@{self.cache_dtype}"))

    @property
    def split_rule(self) -> str:
        """How K and V are taken from the layer's kv_cache."""
        if self.split_axis == "KV":
            return "unbind KV (K=0, V=1)"
        if self.split_axis == "S":
            return "halves of S (K heads S[:H], V heads S[H:])"
        if self.latent:
            return "none (one latent row R per token)"
        if self.diff_kv:
            return "C at K's head dim (K=C[:Dk], V=C[Dk:])"
        if self.cache_dtype == "fp8_per_token_head":
            return "halves of C at the padded width (K=C[:D+4], V=C[D+4:])"
        return "halves of C (K=C[:D], V=C[D:])"

    def describe(self) -> str:
        """One line naming the whole contract, for error messages."""
        scale = f", scales {self.dtype.scale}" if self.dtype.scale else ""
        return (
            f"{self.name} (logical [{','.join(self.logical)}], physical [{','.join(self.physical)}], "
            f"cache dtype {self.cache_dtype}{scale}, split {self.split_rule}){self._from()}"
        )

    def _from(self) -> str:
        return f" from {self.origin}" if str(self.origin) else ""

    def to_json(self) -> dict[str, Any]:
        """The recorded form (fixtures, kept examples); `from_json` reads it back."""
        out: dict[str, Any] = {"logical": list(self.logical), "physical": list(self.physical), "origin": str(self.origin)}
        if self.cache_dtype != "auto":
            out["cache_dtype"] = self.cache_dtype
        if self.diff_kv:
            out["diff_kv"] = True
        return out

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Contract:
        try:
            return cls(tuple(body["logical"]), tuple(body["physical"]), body.get("origin", ""),
                       body.get("cache_dtype", "auto"), body.get("diff_kv", False))
        except KeyError as e:
            raise ContractError(f"recorded contract lacks field {e}: {sorted(body)}") from None

    def size(self, axis: str, dims: Dims) -> int:
        """Size of one named axis at `dims`."""
        if dims.v_dim != dims.head_dim and not self.diff_kv:
            raise ContractError(f"{dims} has V head dim {dims.v_dim} != K head dim {dims.head_dim}, which "
                                f"{self.describe()} cannot hold (not a diff-KV contract)")
        if self.latent and axis == "H" and dims.kv_heads != 1:
            raise ContractError(f"a latent cache has one head slot, {dims} has {dims.kv_heads}: {self.describe()}")
        w = self.dtype.width
        if axis in ("D", "R"):
            return w(dims.head_dim)
        return w(dims.head_dim) + w(dims.v_dim) if axis == "C" else dims.size(axis)

    def element(self, model: torch.dtype) -> torch.dtype:
        """The element type of the kv_cache a layer of a `model`-dtype model receives."""
        return self.dtype.element or model

    def physical_shape(self, dims: Dims) -> tuple[int, ...]:
        """Sizes of the allocation in memory order."""
        return tuple(self.size(a, dims) for a in self.physical)

    def allocate(self, dims: Dims, dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.Tensor:
        """The layer's kv_cache for a model of dtype `dtype`: physical memory viewed logically, every element
        poisoned (NaN; in a byte cache 0xFF, which fp8 e4m3 reads as NaN)."""
        element = self.element(dtype)
        if self.dtype.element is None and not dtype.is_floating_point:
            raise ContractError(f"cannot poison a {dtype} cache; use a floating-point dtype")
        buf = torch.empty(self.physical_shape(dims), dtype=element, device=device)
        if buf.device.type != "meta":
            poison(buf)
        return self._layer_view(buf, dims)

    def _layer_view(self, buf: torch.Tensor, dims: Dims) -> torch.Tensor:
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

    def stored(self, rows: torch.Tensor) -> torch.Tensor:
        """Token rows [T, H, D] of the model dtype as this cache stores one side, in its view type: as they are;
        cast to fp8 (per-tensor scale 1: the scale is a scalar outside the cache, which no layout moves); cast to
        fp8 with an inline fp32 scale of 1; for NVFP4, bytes taken from the rows' bits (a stand-in for quantised
        data and scales: what a layout check needs is where each byte lands, not what it decodes to)."""
        view = self.dtype.view
        if view is None:
            return rows
        if self.cache_dtype == "nvfp4":
            bits = rows.contiguous().view(torch.int16 if rows.element_size() == 2 else torch.int32)
            return (bits & 0xFF).to(torch.uint8)[..., : self.dtype.width(rows.shape[-1])].contiguous()
        out = rows.to(view)
        if self.cache_dtype == "fp8_per_token_head":
            one = torch.ones(rows.shape[:-1] + (1,), dtype=torch.float32, device=rows.device).view(view)
            out = torch.cat([out, one], dim=-1)
        return out

    def data(self, side: torch.Tensor, head_dim: int) -> torch.Tensor:
        """A side's values [.., head_dim] without inline scales, in the type they are read as. ContractError where
        a row holds no values of its own (NVFP4 pages keep all data, then all scales)."""
        if self.cache_dtype == "nvfp4":
            raise ContractError(f"NVFP4 rows are opaque bytes (each page holds packed fp4 data, then fp8 block "
                                f"scales): {self.describe()}")
        return side[..., :head_dim]

    def scales(self, side: torch.Tensor, head_dim: int) -> torch.Tensor | None:
        """A side's inline per-token-head scales [.., 1] (fp32), None where the cache keeps none inline."""
        if self.cache_dtype != "fp8_per_token_head":
            return None
        return side[..., head_dim:head_dim + 4].view(torch.float32)

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

    def _check_memory_order(self, stride: dict[str, int], size: dict[str, int], fail) -> None:
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


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with the value no write produces: NaN, or POISON_BYTE in a byte cache. Returns `t`."""
    return t.fill_(float("nan") if t.dtype.is_floating_point else POISON_BYTE)


def families() -> list[Contract]:
    """Every single-layer model-dtype contract of FlashAttention's three families in NHD and HND order."""
    out = []
    for logical in list(FAMILIES)[:3]:
        body = [a for a in logical if a not in ("N", "H")]
        inner = body.pop()
        for nh in (("N", "H"), ("H", "N")):
            out.append(Contract(logical, tuple(body) + nh + (inner,)))
    return out


def cross_layer(contract: Contract, layers_outermost: bool) -> Contract:
    """`contract` in a shared allocation with layers outermost, or with blocks outermost (L right inside B)."""
    phys = list(contract.physical)
    phys.insert(0 if layers_outermost else phys.index("B") + 1, "L")
    return Contract(contract.logical, tuple(phys), contract.origin, contract.cache_dtype, contract.diff_kv)
