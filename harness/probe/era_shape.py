"""vLLM 0.8.5: a backend's get_kv_cache_shape only; no stride order, so the allocation is the logical shape itself
and no env switch moves it. The write is the first thing an impl's forward does, through
torch.ops._C_cache_ops.reshape_and_cache_flash (patched like the module-level op of later eras). Every backend is
read as in era_stride, whose `views` names the one setting `default`.
"""

from __future__ import annotations

from typing import Any

from harness.probe import era_stride

views = era_stride.views


def missing() -> str | None:
    fa, be = era_stride.backend()
    return None if fa is not None else be


def facts() -> dict[str, Any]:
    return {"era": "era_shape", "method": "get_kv_cache_shape + FlashAttentionImpl.forward write"}
