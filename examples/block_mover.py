import torch


class BlockMover:
    """A KV connector: saves and loads whole blocks of every tensor vLLM registers with it, each through its own
    view, at the block ids of its KV cache group. Each side of a transfer is a BlockMover of its own."""

    name = "block-mover"
    capabilities = frozenset({"connector"})

    def connector(self, kv_cache_config, layers):
        side = type(self)()
        side.layers = layers
        side.group = {n: g for g, group in enumerate(kv_cache_config.kv_cache_groups) for n in group.layer_names}
        return side

    def register_kv_caches(self, kv_caches):
        self.tensors = {n: x if isinstance(x, list) else [x] for n, x in kv_caches.items()}

    def save(self, block_ids):
        return {n: [self.take(t, self.layers.get(n), block_ids[self.group[n]]) for t in ts]
                for n, ts in self.tensors.items()}

    def load(self, block_ids, payload):
        for n, ts in self.tensors.items():
            for t, data in zip(ts, payload[n]):
                self.put(t, self.layers.get(n), block_ids[self.group[n]], data)

    def block_axis(self, layer):  # the axis of a K/V layer's view that get_kv_cache_shape sizes by num_blocks
        ask = getattr(layer.backend, "get_kv_cache_shape", None)
        if ask is None:
            return 0  # the KVCacheLayout releases hand every layer [B, H, N, C]
        a, b = (ask(n, layer.block_size, layer.num_kv_heads, layer.head_size) for n in (3, 5))
        return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)

    def kernel_ids(self, layer, block_ids):  # a scheduler's block holds this many blocks of the layer's view
        per = layer.manager_block_size // layer.block_size
        return (block_ids[:, None] * per + torch.arange(per, device=block_ids.device)).flatten()

    def blocks(self, tensor, layer, block_ids):  # no layer value (Mamba states): a block per row
        return (0, block_ids) if layer is None else (self.block_axis(layer), self.kernel_ids(layer, block_ids))

    def take(self, tensor, layer, block_ids):
        axis, ids = self.blocks(tensor, layer, block_ids)
        return tensor.index_select(axis, ids).cpu()

    def put(self, tensor, layer, block_ids, data):
        axis, ids = self.blocks(tensor, layer, block_ids)
        tensor.index_copy_(axis, ids, data.to(tensor.device))
