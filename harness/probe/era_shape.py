"""vLLM 0.8.5: FlashAttentionBackend.get_kv_cache_shape only; no stride order, so the allocation is the logical
shape itself and no env switch moves it. The write is the first thing forward does, through
torch.ops._C_cache_ops.reshape_and_cache_flash (patched like the module-level op of later eras).
"""

from __future__ import annotations

from harness.fixtures import Recording
from harness.probe import era_stride


def missing() -> str | None:
    fa, be = era_stride.backend()
    return None if fa is not None else be


def probe(version: str) -> Recording:
    fa, be = era_stride.backend()
    return era_stride.read(version, "era_shape", fa, be, era_stride.forward_write(fa), stride_order=False)
