"""vLLM 0.29's one allocation for every layer (intel-accel-for-llm PR #15, vllm-metal #700, vllm-ascend PR #15814):
connectors registered each layer's cache as one flat region, `kv_cache.view(-1)`, a block being one of
`kv_cache.shape[0]` equal rows of it, as the blocks-first caches of vLLM 0.23-0.25 are. From 0.29 each layer gets a
view into the shared allocation whose axes are not in memory order, and `view(-1)` raises; so it does on the packed
[B, H, N, 2D] caches of 0.26-0.28, laid out tokens outside heads; on a kv-first cache (FlashAttention up to 0.22)
the first axis is K/V, not the blocks. The fix moves blocks through each layer's view (the example block mover)."""

from __future__ import annotations

from block_mover import BlockMover


class FlatRegions(BlockMover):
    """A layer's cache is one flat region of `shape[0]` equal blocks, in block order."""

    name = "flat-regions"

    def take(self, tensor, layer, block_ids):
        _, ids = self.blocks(tensor, layer, block_ids)
        return _rows(tensor)[ids].clone()

    def put(self, tensor, layer, block_ids, data):
        _, ids = self.blocks(tensor, layer, block_ids)
        _rows(tensor)[ids] = data


def _rows(kv_cache):
    return kv_cache.view(-1).view(kv_cache.shape[0], -1)


class ThroughViews(BlockMover):
    """Blocks through each layer's view (the fix)."""

    name = "flat-regions-fixed"
