"""kvcached and per-token-head scales (kvcached #424, fixed in #433): it asked get_kv_cache_shape without
cache_dtype_str, so for fp8_per_token_head (and NVFP4) caches it got the model-dtype row width, while vLLM widens
each head's row by its inline scale: the cache it laid out and the one vLLM wrote disagreed, and output was garbled."""

from __future__ import annotations

import dataclasses

from offloader import Offloader, asked_axes, fits, views


class WithoutCacheDtype(Offloader):
    """Names and checks the axes from get_kv_cache_shape asked as for a model-dtype cache."""

    name = "kvcached-424-without-cache-dtype"

    def split(self, kv_cache, layer):
        asked = dataclasses.replace(layer, cache_dtype="auto") if hasattr(layer.backend, "get_kv_cache_shape") \
            else layer
        axes = asked_axes(asked)
        if not fits(kv_cache, asked, axes):
            raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)} is not the {'.'.join(axes)} cache "
                             f"get_kv_cache_shape describes for vLLM {layer.release}")
        return views(kv_cache, layer, axes)


class WithCacheDtype(Offloader):
    """The fix: cache_dtype_str passed wherever get_kv_cache_shape takes it."""

    name = "kvcached-424-with-cache-dtype"
