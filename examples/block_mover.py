import torch


class BlockMover:
    """A KV connector: saves and loads whole blocks of every layer vLLM registers with it, through each layer's view."""

    name = "block-mover"
    capabilities = frozenset({"connector"})

    def block_axis(self, layer):  # the axis of the layer's view that get_kv_cache_shape sizes by num_blocks
        ask = getattr(layer.backend, "get_kv_cache_shape", None)
        if ask is None:
            return 0  # the KVCacheLayout releases hand every layer [B, H, N, C]
        a, b = (ask(n, layer.block_size, layer.num_kv_heads, layer.head_size) for n in (3, 5))
        return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)

    def kernel_ids(self, layer, block_ids):  # a scheduler's block holds this many blocks of the layer's view
        per = layer.manager_block_size // layer.block_size
        return (block_ids[:, None] * per + torch.arange(per, device=block_ids.device)).flatten()

    def extract_blocks(self, kv_caches, layers, block_ids):
        return {name: kv.index_select(self.block_axis(layers[name]), self.kernel_ids(layers[name], block_ids)).cpu()
                for name, kv in kv_caches.items()}

    def inject_blocks(self, kv_caches, layers, block_ids, payload):
        for name, kv in kv_caches.items():
            kv.index_copy_(self.block_axis(layers[name]), self.kernel_ids(layers[name], block_ids),
                           payload[name].to(kv.device))
