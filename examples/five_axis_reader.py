class FiveAxisReader:
    """Reads vLLM's 5-axis caches, kv-first [2, B, N, H, D] or blocks-first [B, 2, N, H, D], as the layer's backend
    class describes them; refuses any tensor that is not that cache."""

    name = "five-axis-reader"
    capabilities = frozenset({"split"})

    def supports_layer(self, layer):  # the caches it does not read: `unsupported` there, never a pass
        if layer.cache_dtype != "auto" or layer.cross_layer or not hasattr(layer.backend, "get_kv_cache_shape"):
            return "per-layer model-dtype caches of releases with get_kv_cache_shape only"
        if len(self.shape(layer, 1)) != 5:
            return "5-axis caches only"

    def shape(self, layer, num_blocks):  # what vLLM's backend class (or its recorded stand-in) answers
        return tuple(layer.backend.get_kv_cache_shape(num_blocks, layer.block_size, layer.num_kv_heads,
                                                      layer.head_size))

    def split(self, kv_cache, layer):
        blocks_first = self.shape(layer, 1)[0] == 1
        want = self.shape(layer, kv_cache.shape[0 if blocks_first else 1]) if kv_cache.dim() == 5 else None
        order = list(getattr(layer.backend, "get_kv_cache_stride_order", lambda: range(5))())
        swapped = [order[1], order[0], *order[2:]]  # blocks outside K/V: a hybrid model's layers get these
        ordered = want and any((s := [kv_cache.stride(i) for i in o]) == sorted(s, reverse=True)
                               for o in (order, swapped))
        if tuple(kv_cache.shape) != want or kv_cache.stride(-1) != 1 or not ordered:
            raise ValueError(f"kv_cache of shape {tuple(kv_cache.shape)} strides {kv_cache.stride()} is not the "
                             f"{want} cache vLLM {layer.release} lays out")
        return (kv_cache[:, 0], kv_cache[:, 1]) if blocks_first else (kv_cache[0], kv_cache[1])
