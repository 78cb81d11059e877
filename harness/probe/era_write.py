"""vLLM 0.15 - 0.28: the shape and stride-order API of era_stride, but the cache write moved out of forward into
FlashAttentionImpl.do_kv_cache_update(layer, key, value, kv_cache, slot_mapping). Inside this era the logical
shape changed twice (kv-first, blocks-first from 0.23, packed (B,H,N,2D) from 0.26); the adapter reads it either way.
"""

from __future__ import annotations

import types
from collections.abc import Callable

from harness.probe import observe as p
from harness.fixtures import Recording
from harness.probe import era_stride


def missing() -> str | None:
    gap = era_stride.missing()
    if gap is not None:
        return gap
    fa, _ = era_stride.backend()
    if "do_kv_cache_update" not in vars(fa.FlashAttentionImpl):
        return "FlashAttentionImpl has no do_kv_cache_update"
    return None


def probe(version: str) -> Recording:
    fa, be = era_stride.backend()
    return era_stride.read(version, "era_write", fa, be, method_write(fa), stride_order=True)


def method_write(fa: types.ModuleType) -> tuple[str, Callable]:
    impl = p.impl_for(fa.FlashAttentionImpl, fa)

    def write(key, value, kv_cache, slots):
        impl.do_kv_cache_update(p.layer(), key, value, kv_cache, slots)

    return "FlashAttentionImpl.do_kv_cache_update", write
