"""The cache-dtype part of a contract: how one of vLLM's `kv_cache_dtype` settings stores a side (K or V) of one
token and head, as a row of the cache's elements.

A row is the head dim's values for the model dtype and per-tensor fp8; the values then an inline fp32 scale (4 fp8
elements) for per-token-head fp8; for NVFP4, head_dim/2 bytes of packed fp4 plus head_dim/16 fp8 block scales,
stored per page as all data then all scales (so a row is opaque bytes).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from harness.contract.layout import ContractError

SCALE_ELEMENTS = 4  # an inline fp32 scale, as one-byte elements
FP4_BLOCK = 16  # values per NVFP4 block scale


class Row(enum.Enum):
    """What one side's stored row of a token and head holds."""

    VALUES = "values"  # head_dim values; a per-tensor scale, if any, is a scalar outside the cache
    SCALED = "values + inline scale"  # head_dim fp8 values, then their fp32 scale
    FP4_PAGE = "opaque fp4 bytes"  # a share of its page's packed fp4 data and fp8 block scales


@dataclass(frozen=True)
class CacheDtype:
    """One `kv_cache_dtype` setting: the element type of the kv_cache a layer receives and the type its K and V
    views are retyped to (None: the model dtype), what a stored row holds, where the dequantisation scale lives
    ("" when there is none) and whether vLLM's MLA backends keep a latent cache in it (`mla`)."""

    name: str
    element: torch.dtype | None
    view: torch.dtype | None
    row: Row
    scale: str
    mla: bool = False

    @property
    def values_only(self) -> bool:
        """A side's row is just its head_dim values, so K and V may have their own head dims."""
        return self.row is Row.VALUES

    def cache_element(self, model: torch.dtype) -> torch.dtype:
        """The element type of the kv_cache a layer of a `model`-dtype model receives."""
        return self.element or model

    def width(self, head_dim: int) -> int:
        """Stored elements of one side per token and head."""
        if self.row is Row.SCALED:
            return head_dim + SCALE_ELEMENTS
        if self.row is Row.FP4_PAGE:
            if head_dim % FP4_BLOCK:
                raise ContractError(f"a {self.name} cache needs head_dim divisible by {FP4_BLOCK}, got {head_dim}")
            return head_dim // 2 + head_dim // FP4_BLOCK
        return head_dim

    def stored(self, rows: torch.Tensor) -> torch.Tensor:
        """Token rows [T, H, D] of the model dtype as this cache stores one side, in its view type: as they are;
        cast to fp8 (per-tensor scale 1: the scale is a scalar outside the cache, which no layout moves); cast to
        fp8 with an inline fp32 scale of 1; for NVFP4, bytes taken from the rows' bits (a stand-in for quantised
        data and scales: what a layout check needs is where each byte lands, not what it decodes to)."""
        if self.view is None:
            return rows
        if self.row is Row.FP4_PAGE:
            bits = rows.contiguous().view(torch.int16 if rows.element_size() == 2 else torch.int32)
            return (bits & 0xFF).to(torch.uint8)[..., : self.width(rows.shape[-1])].contiguous()
        out = rows.to(self.view)
        if self.row is Row.SCALED:
            one = torch.ones(rows.shape[:-1] + (1,), dtype=torch.float32, device=rows.device).view(self.view)
            out = torch.cat([out, one], dim=-1)
        return out

    def data(self, side: torch.Tensor, head_dim: int) -> torch.Tensor:
        """A side's values [.., head_dim] without inline scales, in the type they are read as. ContractError where
        a row holds no values of its own."""
        if self.row is Row.FP4_PAGE:
            raise ContractError(f"{self.name} rows are opaque bytes (each page holds packed fp4 data, then fp8 "
                                f"block scales)")
        return side[..., :head_dim]

    def scales(self, side: torch.Tensor, head_dim: int) -> torch.Tensor | None:
        """A side's inline scales [.., 1] (fp32), None where the cache keeps none inline."""
        if self.row is not Row.SCALED:
            return None
        return side[..., head_dim:head_dim + SCALE_ELEMENTS].view(torch.float32)


PER_TENSOR = "per tensor (the layer's k_scale / v_scale)"
CACHE_DTYPES = {c.name: c for c in (
    CacheDtype("auto", None, None, Row.VALUES, "", mla=True),
    CacheDtype("fp8_e4m3", torch.uint8, torch.float8_e4m3fn, Row.VALUES, PER_TENSOR, mla=True),
    CacheDtype("fp8_e5m2", torch.uint8, torch.float8_e5m2, Row.VALUES, PER_TENSOR),
    CacheDtype("fp8_per_token_head", torch.uint8, torch.float8_e4m3fn, Row.SCALED,
               "inline fp32 after each side's head_dim values"),
    CacheDtype("nvfp4", torch.uint8, torch.uint8, Row.FP4_PAGE, "fp8 per 16 values, after the page's packed fp4 data"),
)}
ALIASES = {"fp8": "fp8_e4m3"}  # vLLM's `fp8` is e4m3 on CUDA


def cache_dtype(name: str) -> CacheDtype:
    """The cache dtype a vLLM `kv_cache_dtype` string names; ContractError for one kvconform cannot express."""
    try:
        return CACHE_DTYPES[ALIASES.get(name, name)]
    except KeyError:
        raise ContractError(f"unknown cache dtype {name!r}; known: {', '.join(CACHE_DTYPES)}") from None
