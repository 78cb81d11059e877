"""kvcached and KV-sharing layers (kvcached #417, fixed in #472): vLLM appends a layer that reuses another layer's
cache to its KV cache group's layer_names, but to no KVCacheTensor's shared_by. kvcached bound every group layer to
the tensor whose shared_by names it and failed at start-up with a bare KeyError (Gemma E2B, vLLM 0.22.1-0.24.0).
The fix binds only the layers that own a tensor; a sharing layer is handed its target's cache, as vLLM does."""

from __future__ import annotations

from block_mover import BlockMover


class EveryGroupLayerOwnsATensor(BlockMover):
    """Binds each layer of each group to its KVCacheTensor by name."""

    name = "kvcached-417-every-layer-owns-a-tensor"

    def connector(self, kv_cache_config, layers):
        side = super().connector(kv_cache_config, layers)
        tensor_of = {n: t for t in kv_cache_config.kv_cache_tensors for n in t.shared_by}
        side.bound = {n: tensor_of[n] for g in kv_cache_config.kv_cache_groups for n in g.layer_names
                      if self.binds(n, tensor_of)}
        return side

    def binds(self, name, tensor_of):
        return True


class OwnersBound(EveryGroupLayerOwnsATensor):
    """Binds the group layers that some KVCacheTensor names; the others share a cache vLLM hands them (the fix)."""

    name = "kvcached-417-owners-bound"

    def binds(self, name, tensor_of):
        return name in tensor_of
