"""NVFP4 caches on devices that resolve NHD (vLLM #49011): vLLM 0.26's NVFP4 cache is [B, 2H, N, D/2 + D/16], K's
heads then V's, and its data/scale split assumed each head's tokens contiguous (head-major, as the HND layout that
sm100 forces lays it out). Where the layout resolved to NHD the page was token-major and the split landed on the
wrong bytes: every generation collapsed to one token. (#50084, V's scales written swizzled and read linearly, is a
value order inside a scale region: the recordings hold where each side's row bytes lie, not how a write kernel
orders scales inside them, so it cannot be expressed here.)"""

from __future__ import annotations

from offloader import Offloader, asked_axes
from .believed import believed_views, heads_placed, refuse_rank


class HeadMajorNvfp4(Offloader):
    """Reads an NVFP4 head-slot cache as head-major (the head slots outside the tokens); other caches as stated."""

    name = "vllm-49011-head-major-nvfp4"

    def split(self, kv_cache, layer):
        axes = asked_axes(layer)
        if "S" not in axes:
            return super().split(kv_cache, layer)
        refuse_rank(kv_cache, axes)
        return believed_views(kv_cache, layer, axes, heads_placed(axes, True))


class StatedNvfp4(Offloader):
    """The fix: the head slots' place in memory as the layout in force states it."""

    name = "vllm-49011-stated-nvfp4"
