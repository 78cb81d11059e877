"""The layout part of a contract: which axes a layer's kv_cache has, in which memory order, and their sizes."""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES: dict[tuple[str, ...], str] = {
    ("KV", "B", "N", "H", "D"): "kv-first",
    ("B", "KV", "N", "H", "D"): "blocks-first",
    ("B", "H", "N", "C"): "packed",
    ("B", "N", "H", "C"): "packed-tokens",
    ("B", "S", "N", "D"): "head-slots",
    ("B", "N", "R"): "latent",
    ("B", "H", "N", "R"): "latent",
}
CANONICAL = ("B", "N", "H", "D")


class ContractError(ValueError):
    """A layout that does not match, or cannot be expressed as, a known contract."""


@dataclass(frozen=True)
class Layout:
    """Logical axes of a layer's kv_cache and the physical (memory) order of its allocation, outermost first."""

    logical: tuple[str, ...]
    physical: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.logical not in FAMILIES:
            known = ", ".join(f"{name} [{','.join(axes)}]" for axes, name in FAMILIES.items())
            raise ContractError(
                f"unknown logical layout [{','.join(self.logical)}]; known families: {known}"
            )
        extra = sorted(set(self.physical) - set(self.logical))
        if sorted(self.physical) != sorted(self.logical + tuple(extra)) or extra not in ([], ["L"]):
            raise ContractError(
                f"physical order [{','.join(self.physical)}] is not a permutation of the logical axes "
                f"[{','.join(self.logical)}] plus an optional L"
            )
        if self.physical[-1] != self.logical[-1]:
            raise ContractError(
                f"physical order [{','.join(self.physical)}] must keep {self.logical[-1]} innermost"
            )

    @property
    def family(self) -> str:
        """kv-first, blocks-first, packed, packed-tokens, head-slots or latent."""
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
    def order(self) -> str:
        """NHD when tokens sit outside heads in memory, HND otherwise."""
        heads = next(a for a in ("H", "S") if a in self.physical) if not self.logical == ("B", "N", "R") else "N"
        return "NHD" if self.physical.index("N") <= self.physical.index(heads) else "HND"


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
        """Size of one named axis in a model-dtype cache (views.size for any cache dtype)."""
        return {"L": self.num_layers, "B": self.num_blocks, "KV": 2, "N": self.block_size, "H": self.kv_heads,
                "S": 2 * self.kv_heads, "D": self.head_dim, "C": self.head_dim + self.v_dim, "R": self.head_dim}[axis]
