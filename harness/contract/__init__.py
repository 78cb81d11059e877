"""How one vLLM release, attention backend and cache dtype lay out a layer's paged KV cache.

Axis letters, used throughout kvconform:
  L layers (only in a shared multi-layer allocation), B blocks, KV the K/V pair (size 2), N tokens per block,
  H kv heads, S head slots (K's H heads then V's H heads), D one side's stored width, C both sides' widths packed
  (K is C[:Dk], V is C[Dk:]), R one latent row (MLA: no K/V pair).
A contract holds two parts and where it was read: its layout (layout.py: the logical axes of the `kv_cache` tensor a
layer receives and the physical order of the allocation's axes in memory, outermost first; the split rule follows
from the family) and its cache dtype's storage (storage.py: element types, a side's stored width, rows and scales).
Its views are functions of a contract (views.py: sizes, allocate, poison, split, validate). Canonical K and V views
are [B, N, H, Dk] and [B, N, H, Dv] in the cache's element type and alias the cache; a latent cache has one
canonical view [B, N, R].
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from harness.contract import storage
from harness.contract.layout import CANONICAL, FAMILIES, ContractError, Dims, Layout
from harness.contract.storage import ALIASES, CACHE_DTYPES, SCALE_ELEMENTS, CacheDtype, Row, cache_dtype

__all__ = ["ALIASES", "CACHE_DTYPES", "CANONICAL", "FAMILIES", "CacheDtype", "Contract", "ContractError", "Dims",
           "Layout", "Origin", "Row", "cache_dtype", "cross_layer", "families"]


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
    """A layout read from one origin, stored in one cache dtype; `diff_kv` when V's head dim is its own (the diff-KV
    backends), so that C is Dk + Dv. `Contract.of` builds one from its recorded fields."""

    layout: Layout
    dtype: CacheDtype = CACHE_DTYPES["auto"]
    origin: Origin = field(default=Origin(), compare=False)
    diff_kv: bool = False

    def __post_init__(self) -> None:
        if self.diff_kv and "C" not in self.layout.logical:
            raise ContractError(f"K and V head dims can differ only when they are packed in C, not in "
                                f"[{','.join(self.layout.logical)}]{_from(self.origin)}")
        if self.diff_kv and not self.dtype.values_only:
            raise ContractError(f"unequal K/V head dims in a {self.cache_dtype} cache are not expressible (its sides "
                                f"are padded or opaque){_from(self.origin)}")
        if self.layout.latent and not self.dtype.mla:
            raise ContractError(f"a latent cache in {self.cache_dtype} is not expressible{_from(self.origin)}")

    @classmethod
    def of(cls, logical: tuple[str, ...], physical: tuple[str, ...], origin: Origin | str = "",
           cache_dtype: str = "auto", diff_kv: bool = False) -> Contract:
        """The contract of axes as named (a recorded origin line parsed), its errors naming the origin."""
        origin = origin if isinstance(origin, Origin) else Origin.parse(origin)
        try:
            layout = Layout(tuple(logical), tuple(physical))
        except ContractError as e:
            raise ContractError(f"{e}{_from(origin)}") from None
        return cls(layout, storage.cache_dtype(cache_dtype), origin, diff_kv)

    @property
    def cache_dtype(self) -> str:
        """The cache dtype's name, as vLLM's `kv_cache_dtype` spells it (`fp8` as `fp8_e4m3`)."""
        return self.dtype.name

    @property
    def name(self) -> str:
        """Family, physical order, K/V head dims and cache dtype, e.g. `packed:B.H.N.C@fp8_e4m3`."""
        return (f"{self.layout.family}:{'.'.join(self.layout.physical)}" + ("+diffkv" if self.diff_kv else "")
                + ("" if self.cache_dtype == "auto" else f"@{self.cache_dtype}"))

    @property
    def split_rule(self) -> str:
        """How K and V are taken from the layer's kv_cache."""
        if self.layout.split_axis == "KV":
            return "unbind KV (K=0, V=1)"
        if self.layout.split_axis == "S":
            return "halves of S (K heads S[:H], V heads S[H:])"
        if self.layout.latent:
            return "none (one latent row R per token)"
        if self.diff_kv:
            return "C at K's head dim (K=C[:Dk], V=C[Dk:])"
        if self.dtype.row is Row.SCALED:
            pad = SCALE_ELEMENTS
            return f"halves of C at the padded width (K=C[:D+{pad}], V=C[D+{pad}:])"
        return "halves of C (K=C[:D], V=C[D:])"

    def describe(self) -> str:
        """One line naming the whole contract, for error messages."""
        scale = f", scales {self.dtype.scale}" if self.dtype.scale else ""
        return (
            f"{self.name} (logical [{','.join(self.layout.logical)}], physical [{','.join(self.layout.physical)}], "
            f"cache dtype {self.cache_dtype}{scale}, split {self.split_rule}){_from(self.origin)}"
        )

    def to_json(self) -> dict[str, Any]:
        """The recorded form (fixtures, kept examples); `from_json` reads it back."""
        out: dict[str, Any] = {"logical": list(self.layout.logical), "physical": list(self.layout.physical),
                               "origin": str(self.origin)}
        if self.cache_dtype != "auto":
            out["cache_dtype"] = self.cache_dtype
        if self.diff_kv:
            out["diff_kv"] = True
        return out

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Contract:
        try:
            return cls.of(body["logical"], body["physical"], body.get("origin", ""), body.get("cache_dtype", "auto"),
                          body.get("diff_kv", False))
        except KeyError as e:
            raise ContractError(f"recorded contract lacks field {e}: {sorted(body)}") from None


def families() -> list[Contract]:
    """Every single-layer model-dtype contract of FlashAttention's three families in NHD and HND order."""
    out = []
    for logical in list(FAMILIES)[:3]:
        body = [a for a in logical if a not in ("N", "H")]
        inner = body.pop()
        for nh in (("N", "H"), ("H", "N")):
            out.append(Contract(Layout(logical, tuple(body) + nh + (inner,))))
    return out


def cross_layer(contract: Contract, layers_outermost: bool) -> Contract:
    """`contract` in a shared allocation with layers outermost, or with blocks outermost (L right inside B)."""
    phys = list(contract.layout.physical)
    phys.insert(0 if layers_outermost else phys.index("B") + 1, "L")
    return replace(contract, layout=Layout(contract.layout.logical, tuple(phys)))


def _from(origin: Origin) -> str:
    """Where a contract was read, for error messages ("" when nowhere)."""
    return f" from {origin}" if str(origin) else ""
