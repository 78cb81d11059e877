"""Consumers that compute a cache's addresses from what they believe its memory order is, as native code handed a
data pointer does, instead of reading the tensor's strides."""

from __future__ import annotations

from offloader import views


def believed_views(kv_cache, layer, axes, order):
    """K and V of `kv_cache` (axes named `axes`) read as if its memory held those axes contiguously in `order`
    (outermost first), from the tensor's first element."""
    sizes = dict(zip(axes, kv_cache.shape))
    stride, span = {}, 1
    for a in reversed(order):
        stride[a], span = span, span * sizes[a]
    return views(kv_cache.as_strided(kv_cache.shape, [stride[a] for a in axes], kv_cache.storage_offset()), layer,
                 axes)


def heads_placed(axes, outside_tokens: bool) -> list[str]:
    """`axes` with the heads (H, or the head slots S) outside the tokens N in memory (HND) or inside them (NHD)."""
    order = list(axes)
    n, h = order.index("N"), order.index("H" if "H" in order else "S")
    if (h < n) != outside_tokens:
        order[n], order[h] = order[h], order[n]
    return order


def refuse_rank(kv_cache, axes) -> None:
    if kv_cache.dim() != len(axes):
        raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)}: expected {len(axes)} axes {'.'.join(axes)}")
