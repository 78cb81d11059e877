"""FlexKV and vLLM 0.23's blocks-first cache (FlexKV pull request #187): FlexKV registered every layer's cache as
kv-first (2, num_blocks, block_size, heads, head_size), so on (num_blocks, 2, ...) it read num_blocks as 2 and
every stride was wrong. The fix told the two apart by where the axis of size 2 sits, shape[1] first: on a kv-first
cache of 2 blocks that reads blocks-first."""

from __future__ import annotations

from offloader import Offloader, typed


class KvFirst(Offloader):
    """K and V are kv_cache[0] and kv_cache[1], whatever the release."""

    name = "flexkv-187-kv-first"

    def split(self, kv_cache, layer):
        t = typed(kv_cache, layer)
        return t[0], t[1]


class SizeTwoAtOne(Offloader):
    """A 5-axis cache with shape[1] == 2 is blocks-first, else with shape[0] == 2 kv-first; 4-axis caches as the
    backend states them."""

    name = "flexkv-187-size-two-at-one"

    def split(self, kv_cache, layer):
        if kv_cache.dim() != 5:
            return super().split(kv_cache, layer)
        t = typed(kv_cache, layer)
        if t.shape[1] == 2:
            return t[:, 0], t[:, 1]
        if t.shape[0] == 2:
            return t[0], t[1]
        raise ValueError(f"kv_cache shape {tuple(t.shape)}: no K/V axis of size 2 at 0 or 1")


class AskedKVAxis(Offloader):
    """The K/V axis named from the backend's answers (get_kv_cache_shape at sentinel sizes), never from the sizes."""

    name = "flexkv-187-asked-kv-axis"
