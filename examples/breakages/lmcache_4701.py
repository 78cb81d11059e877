"""LMCache and kernel blocks inside manager blocks (LMCache #4701): the connector indexed each layer's view with the
scheduler's block ids. Where a manager block holds several kernel blocks (FlashInfer's 256-token manager blocks in
64-token kernel blocks, a hybrid model's page-aligned blocks), it stored one kernel page per manager block, another
manager block's, silently. The fix maps each manager id to its kernel blocks, as the example block mover does."""

from __future__ import annotations

from block_mover import BlockMover


class ManagerIdsAsKernelIds(BlockMover):
    """Block `m` of every layer's view is manager block `m`."""

    name = "lmcache-4701-manager-ids"

    def kernel_ids(self, layer, block_ids):
        return block_ids


class KernelBlocksOfManagerBlock(BlockMover):
    """Manager block `m` is the layer's blocks m*R .. m*R + R-1, R = manager_block_size // block_size (the fix)."""

    name = "lmcache-4701-kernel-blocks"
