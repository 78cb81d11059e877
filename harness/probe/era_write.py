"""vLLM 0.15 - 0.28: the shape and stride-order API of era_stride, but the cache write moved out of forward into
the impl's do_kv_cache_update(layer, key, value, kv_cache, slot_mapping). Inside this era FLASH_ATTN's logical shape
changed twice (kv-first, blocks-first from 0.23, packed (B,H,N,2D) from 0.26); the reader takes it either way.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

from harness.backends import Backend
from harness.contract import Contract
from harness.probe import era_stride, write
from harness.probe.era_stride import FA
from harness.probe.imports import module


def missing() -> str | None:
    return era_stride.missing() or write_method_missing()


def write_method_missing() -> str | None:
    """What FLASH_ATTN lacks for a write method of its own (None: its impl has do_kv_cache_update)."""
    fa = module(FA)
    if fa is None or not hasattr(fa, "FlashAttentionImpl"):
        return f"no {FA}.FlashAttentionImpl"
    if "do_kv_cache_update" not in vars(fa.FlashAttentionImpl):
        return "FlashAttentionImpl has no do_kv_cache_update"
    return None


def facts() -> dict[str, Any]:
    return {"era": "era_write", "method": "get_kv_cache_shape + get_kv_cache_stride_order + "
            "FlashAttentionImpl.do_kv_cache_update write", **era_stride.switch()}


def views(version: str, b: Backend, cls: type, cache_dtype: str,
          mod: types.ModuleType) -> Iterator[tuple[str, list[Contract], dict[str, Any]]]:
    return era_stride.views(version, b, cls, cache_dtype, mod, write.METHOD)
