"""A heterogeneous-TP connector (NIXL's kind; vLLM's test_hetero_tp_layout_bug): it asks for HND and slices a block
by heads at byte offsets, taking the head axis from the shape and never the stride order. A backend that ignored the
HND setting (Triton's did) handed it NHD memory, and every head slice read other heads' tokens."""

from __future__ import annotations

from offloader import Offloader, asked_axes
from .believed import believed_views, heads_placed, refuse_rank


class HeadsOutsideTokens(Offloader):
    """Addresses the cache with heads outside tokens in memory (HND), whatever the release's stride order says."""

    name = "nixl-hetero-tp-heads-outside-tokens"

    def split(self, kv_cache, layer):
        axes = asked_axes(layer)
        refuse_rank(kv_cache, axes)
        return believed_views(kv_cache, layer, axes, heads_placed(axes, True))


class StrideOrdered(Offloader):
    """The fix: the head axis's place in memory from the release's stride order."""

    name = "nixl-hetero-tp-stride-ordered"
