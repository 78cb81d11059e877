"""A coverage case, no public breakage: a consumer that reads a diff-KV cache's V at K's width, C[..., Dk:2*Dk], as
where K and V are equally wide. Slicing stops at C's end, so where V is narrower than K the slice is V exactly and
nothing fails; where V is wider it is cut short at K's width and the rest of V is never read."""

from __future__ import annotations

from offloader import Offloader


class VAtKWidth(Offloader):
    """K as the backend states it; V the K-wide slice of C after K (C[..., Dk:2*Dk])."""

    name = "diffkv-v-at-k-width"

    def split(self, kv_cache, layer):
        k, v = super().split(kv_cache, layer)
        return k, v[..., : k.shape[-1]]


class VAtOwnWidth(Offloader):
    """V is all of C after K (C[..., Dk:], layer.head_size_v wide), as the offloader reads it."""

    name = "diffkv-v-at-own-width"
