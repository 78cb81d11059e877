"""vLLM's attention backends that kvconform models, and vLLM's layout setting.

The setting is the environment variable LAYOUT_ENV, which the releases before the KVCacheLayout enum read the
stride order from, through functools caches (CACHED_READS) that keep the first read for the process. It is only
ever changed through `layout_env`, which clears those caches on the way in and out. This module imports nothing of
harness and never imports vLLM.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """One attention backend: vLLM's name for it, its module under vllm.v1.attention.backends, its class, and what
    kind of cache it keeps."""

    name: str
    module: str
    cls: str
    diff_kv: bool = False
    latent: bool = False

    @property
    def path(self) -> str:
        """The backend's module as imported."""
        return f"vllm.v1.attention.backends.{self.module}"


BACKENDS = (
    Backend("FLASH_ATTN", "flash_attn", "FlashAttentionBackend"),
    Backend("FLASHINFER", "flashinfer", "FlashInferBackend"),
    Backend("TRITON_ATTN", "triton_attn", "TritonAttentionBackend"),
    Backend("FLEX_ATTENTION", "flex_attention", "FlexAttentionBackend"),
    Backend("FLASH_ATTN_DIFFKV", "flash_attn_diffkv", "FlashAttentionDiffKVBackend", diff_kv=True),
    Backend("TRITON_MLA", "mla.triton_mla", "TritonMLABackend", latent=True),
)


def backend_named(name: str) -> Backend | None:
    """The backend vLLM names `name`, None for one kvconform does not model."""
    return next((b for b in BACKENDS if b.name == name), None)


LAYOUT_ENV = "VLLM_KV_CACHE_LAYOUT"
LAYOUT_VALUES = ("NHD", "HND")  # what the variable documents
CACHED_READS = (  # (module, function): a read of the setting that a functools cache may keep
    ("vllm.v1.attention.backends.utils", "get_kv_cache_layout"),  # 0.9 - 0.28
    ("vllm.envs", "__getattr__"),  # cached once vllm.envs.enable_envs_cache() ran
)


@contextlib.contextmanager
def layout_env(value: str | None) -> Iterator[None]:
    """LAYOUT_ENV set to `value` (unset for None) with vLLM's cached reads of it cleared; both restored on exit."""
    old = os.environ.get(LAYOUT_ENV)
    _set(value)
    try:
        yield
    finally:
        _set(old)


def _set(value: str | None) -> None:
    if value is None:
        os.environ.pop(LAYOUT_ENV, None)
    else:
        os.environ[LAYOUT_ENV] = value
    # Looked up at each change, not imported: a module not imported yet holds no cached read, and a release may
    # wrap its reader in a cache after the setting was entered (enable_envs_cache).
    for module, name in CACHED_READS:
        read = getattr(sys.modules.get(module), name, None)
        if hasattr(read, "cache_clear"):
            read.cache_clear()
