"""LMCache's connector on vLLM 0.26's packed layout (LMCache #4463, fixed in #4467): it told a fused reading (K and V
the halves of each head's row) from a split one (an axis of size 2 for K and V) by the tensor's shape. With 2 KV heads
a packed [B, N, H=2, 2D] and a split [B, N, KV=2, H*D] reading have the same shape, and K and V came from the wrong
elements, silently: found only by comparing cache-served answers with recomputed ones."""

from __future__ import annotations

from offloader import Offloader, typed


class SizeTwoIsKV(Offloader):
    """The first axis of size 2 (ahead of the innermost) is the K/V pair, the rest [B, N, H, D] (a 4-axis cache's rest
    [B, N, H*D]); a 4-axis cache without one is packed [B, H, N, 2D], K and V the halves of its innermost axis."""

    name = "lmcache-4463-size-two-is-kv"

    def split(self, kv_cache, layer):
        t = typed(kv_cache, layer)
        pair = next((i for i in range(t.dim() - 1) if t.shape[i] == 2), None)
        if pair is None:
            if t.dim() != 4:
                raise ValueError(f"kv_cache shape {tuple(t.shape)}: no K/V axis of size 2 and not 4 axes")
            half = t.shape[-1] // 2
            return t[..., :half].transpose(1, 2), t[..., half:].transpose(1, 2)
        k, v = t.select(pair, 0), t.select(pair, 1)
        if k.dim() == 3:  # [B, N, H*D]
            return k.unflatten(-1, (layer.num_kv_heads, -1)), v.unflatten(-1, (layer.num_kv_heads, -1))
        return k, v


class StatedLayout(Offloader):
    """The fix's way: the layout is stated, not told from the shape (#4467 made the caller declare it); here every
    axis is named from the backend's own answers."""

    name = "lmcache-4463-stated-layout"
