"""vLLM's offload cache across layout settings (vLLM #55904): blocks written under one KVCacheLayout (LBNHC) and read
under another (LBHNC) returned garbage, with no error: a block holds the same bytes under both, so every size check
passed. The persistent namespace did not record the layout the pages were written in."""

from __future__ import annotations

import torch

from offloader import Offloader, asked_axes


def _in_memory(t):
    """`t`'s axes in memory order (outermost first; an axis of size 1 inside its equal-strided twin)."""
    return t.permute(sorted(range(t.dim()), key=lambda i: (-t.stride(i), -t.shape[i])))


class RawBlocks(Offloader):
    """Moves a block as its bytes, in the order memory holds them."""

    name = "vllm-55904-raw-blocks"

    def extract(self, kv_cache, layer, block_ids):
        b = asked_axes(layer).index("B")
        return torch.stack([_in_memory(kv_cache.select(b, int(i))).flatten() for i in block_ids]).to("cpu")

    def inject(self, kv_cache, layer, block_ids, payload):
        b = asked_axes(layer).index("B")
        for i, raw in zip(block_ids, payload):
            block = _in_memory(kv_cache.select(b, int(i)))
            block.copy_(raw.to(kv_cache.device).view(block.shape))


class ViewBlocks(Offloader):
    """The fix's effect: a block moves as its K and V values, read and written through each setting's own views."""

    name = "vllm-55904-view-blocks"
