"""How one vLLM release lays out a FlashAttention layer's paged KV cache.

Axis letters, used throughout kvconform:
  L layers (only in a shared multi-layer allocation), B blocks, KV the K/V pair (size 2),
  N tokens per block, H kv heads, D head dim, C packed content (2*D: K is C[:D], V is C[D:]).
A contract names the logical axes of the `kv_cache` tensor a layer receives and the physical order of the
allocation's axes in memory, outermost first. The K/V split rule follows from the family. Canonical K and V
views are always [B, N, H, D] and alias the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

FAMILIES: dict[tuple[str, ...], str] = {
    ("KV", "B", "N", "H", "D"): "kv-first",
    ("B", "KV", "N", "H", "D"): "blocks-first",
    ("B", "H", "N", "C"): "packed",
}
CANONICAL = ("B", "N", "H", "D")


class ContractError(ValueError):
    """A layout that does not match, or cannot be expressed as, a known contract."""


@dataclass(frozen=True)
class Dims:
    """Concrete sizes at which a contract is instantiated."""

    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    num_layers: int = 1
    layer: int = 0

    def __post_init__(self) -> None:
        sizes = (self.num_blocks, self.block_size, self.kv_heads, self.head_dim, self.num_layers)
        if min(sizes) < 1 or not 0 <= self.layer < self.num_layers:
            raise ContractError(f"invalid dims {self}")

    def size(self, axis: str) -> int:
        """Size of one named axis."""
        return {
            "L": self.num_layers,
            "B": self.num_blocks,
            "KV": 2,
            "N": self.block_size,
            "H": self.kv_heads,
            "D": self.head_dim,
            "C": 2 * self.head_dim,
        }[axis]


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
    """A contract at concrete dims: the layer's kv_cache and its canonical K and V views."""

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

    def __str__(self) -> str:
        head = f"vllm {self.release} {self.backend}" if self.release else ""
        return " ".join(p for p in (head, self.setting) if p)


@dataclass(frozen=True)
class Contract:
    """Logical axes of a layer's kv_cache plus the physical (memory) order of its allocation."""

    logical: tuple[str, ...]
    physical: tuple[str, ...]
    origin: Origin = field(default=Origin(), compare=False)  # a recorded line is parsed into an Origin

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

    @property
    def family(self) -> str:
        """kv-first, blocks-first or packed."""
        return FAMILIES[self.logical]

    @property
    def packed(self) -> bool:
        """K and V are halves of the innermost axis C."""
        return "C" in self.logical

    @property
    def shared(self) -> bool:
        """Several layers share one allocation (the physical order holds L)."""
        return "L" in self.physical

    @property
    def order(self) -> str:
        """NHD when tokens sit outside heads in memory, HND otherwise."""
        return "NHD" if self.physical.index("N") < self.physical.index("H") else "HND"

    @property
    def name(self) -> str:
        """Family and physical order, e.g. `blocks-first:B.KV.H.N.D`."""
        return f"{self.family}:{'.'.join(self.physical)}"

    @property
    def split_rule(self) -> str:
        """How K and V are taken from the layer's kv_cache."""
        return "halves of C (K=C[:D], V=C[D:])" if self.packed else "unbind KV (K=0, V=1)"

    def describe(self) -> str:
        """One line naming the whole contract, for error messages."""
        return (
            f"{self.name} (logical [{','.join(self.logical)}], physical [{','.join(self.physical)}], "
            f"split {self.split_rule}){self._from()}"
        )

    def _from(self) -> str:
        return f" from {self.origin}" if str(self.origin) else ""

    def physical_shape(self, dims: Dims) -> tuple[int, ...]:
        """Sizes of the allocation in memory order."""
        return tuple(dims.size(a) for a in self.physical)

    def allocate(self, dims: Dims, dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.Tensor:
        """The layer's kv_cache: physical memory viewed logically, every element poisoned (NaN)."""
        if not dtype.is_floating_point:
            raise ContractError(f"cannot poison a {dtype} cache; use a floating-point dtype")
        buf = torch.empty(self.physical_shape(dims), dtype=dtype, device=device)
        if buf.device.type != "meta":
            buf.fill_(float("nan"))
        return self._layer_view(buf, dims)

    def _layer_view(self, buf: torch.Tensor, dims: Dims) -> torch.Tensor:
        axes = (("L",) if self.shared else ()) + self.logical
        view = buf.permute([self.physical.index(a) for a in axes])
        return view[dims.layer] if self.shared else view

    def geometry(self, dims: Dims, dtype: torch.dtype = torch.float16) -> Geometry:
        """Shape, strides and offsets of kv_cache, K and V at `dims` (no memory is touched)."""
        kv_cache = self.allocate(dims, dtype, device="meta")
        k, v = self.split(kv_cache, dims)
        return Geometry(View.of(kv_cache), View.of(k), View.of(v))

    def split(self, kv_cache: torch.Tensor, dims: Dims | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Canonical K and V views [B, N, H, D] aliasing `kv_cache`."""
        self.validate(kv_cache, dims)
        if self.packed:
            t = kv_cache.permute([self.logical.index(a) for a in ("B", "N", "H", "C")])
            d = t.shape[-1] // 2
            return t[..., :d], t[..., d:]
        t = kv_cache.permute([self.logical.index(a) for a in ("KV",) + CANONICAL])
        return t[0], t[1]

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
        size = dict(zip(self.logical, shape))
        if not self.packed and size["KV"] != 2:
            fail(f"K/V axis has size {size['KV']}, expected 2")
        if self.packed and size["C"] % 2:
            fail(f"packed axis C has odd size {size['C']}, expected 2*head_dim")
        if dims is not None:
            for axis in self.logical:
                if size[axis] != dims.size(axis):
                    what = f"2*head_dim = {dims.size(axis)}" if axis == "C" else str(dims.size(axis))
                    fail(f"axis {axis} has size {size[axis]}, expected {what} for {dims}")
        inner = self.logical[-1]
        if size[inner] > 1 and stride[self.logical.index(inner)] != 1:
            fail(f"innermost axis {inner} has stride {stride[self.logical.index(inner)]}, expected 1")
        self._check_memory_order(dict(zip(self.logical, stride)), size, fail)
        if dims is not None:
            expected = self.allocate(dims, kv_cache.dtype, device="meta").stride()
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


def families() -> list[Contract]:
    """Every single-layer contract of the three families in NHD and HND order."""
    out = []
    for logical in FAMILIES:
        body = [a for a in logical if a not in ("N", "H")]
        inner = body.pop()
        for nh in (("N", "H"), ("H", "N")):
            out.append(Contract(logical, tuple(body) + nh + (inner,)))
    return out


def cross_layer(contract: Contract, layers_outermost: bool) -> Contract:
    """`contract` in a shared allocation with layers outermost, or with blocks outermost (L right inside B)."""
    phys = list(contract.physical)
    phys.insert(0 if layers_outermost else phys.index("B") + 1, "L")
    return Contract(contract.logical, tuple(phys), contract.origin)

