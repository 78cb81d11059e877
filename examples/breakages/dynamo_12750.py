"""Dynamo's KV block manager and a layer-separate cache (Dynamo #12750): the "layer_separate" setting was parsed as
outer-contiguous, [2, num_blocks, page], so on vLLM's [num_blocks, 2, page] caches the block and outer strides were
swapped and the wrong K and V were read, while the sizes validated."""

from __future__ import annotations

from offloader import Offloader, asked_axes, stated_order
from .believed import believed_views, refuse_rank


class OuterContiguous(Offloader):
    """A 5-axis cache is addressed as K/V outermost, then blocks, then one page in the order the release states."""

    name = "dynamo-12750-outer-contiguous"

    def split(self, kv_cache, layer):
        axes = asked_axes(layer)
        if "KV" not in axes:
            raise ValueError(f"kv_cache shape {tuple(kv_cache.shape)}: a layer-separate cache has a K/V axis")
        refuse_rank(kv_cache, axes)
        page = [a for a in stated_order(layer, axes) or axes if a not in ("KV", "B")]
        return believed_views(kv_cache, layer, axes, ["KV", "B", *page])


class ShapeDetected(Offloader):
    """The fix: the layout is read from the cache as the release lays it out, never from the setting's name."""

    name = "dynamo-12750-shape-detected"
