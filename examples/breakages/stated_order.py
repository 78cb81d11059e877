"""Coverage case: a connector that takes a layer's cache only in the memory order its backend states (the example
offloader's own check, which rejects-malformed asks of a consumer handed one layer's cache). A whole model's
allocation can order a layer's view otherwise: up to vLLM 0.22 a hybrid model's FlashAttention layers get kv-first
views [2, B, N, H, D] whose blocks are outermost in memory, so that attention and Mamba pages line up per block.
The connector refuses them (a subject-error); the example block mover moves them through their strides."""

from __future__ import annotations

from block_mover import BlockMover
from offloader import Offloader


class StatedOrderOnly(BlockMover):
    """Each layer's K and V through the example offloader, which refuses a memory order the backend does not state
    (the tensors with no layer value as the block mover moves them)."""

    name = "stated-order-only"
    offloader = Offloader()

    def take(self, tensor, layer, block_ids):
        if layer is None:
            return super().take(tensor, layer, block_ids)
        return self.offloader.extract(tensor, layer, self.kernel_ids(layer, block_ids))

    def put(self, tensor, layer, block_ids, data):
        if layer is None:
            return super().put(tensor, layer, block_ids, data)
        self.offloader.inject(tensor, layer, self.kernel_ids(layer, block_ids), data)


class TensorsOwnOrder(BlockMover):
    """Each layer's blocks through the tensor's own strides (the example block mover)."""

    name = "tensors-own-order"
