"""The `vllm-example` subject: vLLM's own ExampleConnector
(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py), unmodified, driven as vLLM drives a KV connector
(a `connector` subject: harness.checks.model_transfer). It ships with each vLLM release, so its releases are vLLM's.
Live only: it needs the installed release's own VllmConfig and KVCacheConfig (`needs_vllm`), so a replay says not-run.

What runs is vLLM's code; this adapter only calls its entry points, as vLLM's scheduler, model runner and attention
layers call them:
- a side: `KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)`, `vllm_config`
  the release's current one with the user's `--kv-transfer-config` (`transfer_config`: ExampleConnector, its
  `shared_storage_path` one directory per process, which both sides read as two vLLM instances share a disk); its own
  `__init__` takes the block size the scheduler's, `cache_config.block_size`. vLLM turns the hybrid KV cache manager
  off for a connector that does not support it (`VllmConfig`: `KVConnectorFactory.supports_hma_config`), which plans
  a one-group model the same: a side of such a model is built so (`--disable-hybrid-kv-cache-manager`); a model of
  several groups is planned otherwise without the manager, and the factory's own refusal says so;
- then `register_kv_caches` with what vLLM registers; each layer's `kv_cache` is the tensor it was bound, the one
  registered under its name (the allocation record has them the same);
- save: the store request ExampleConnector's `build_connector_meta` makes for a new request (`add_request`, its
  block size, `is_store=True`), bound as the connector's metadata, then `save_kv_layer` per attention layer with its
  cache, as vLLM's attention layers call it after their forward, then `wait_for_save()`; the request's prompt is one
  token longer than the blocks (ExampleConnector caches a prompt's whole blocks before its last token), fresh per
  save, and is the payload;
- load: the load request `build_connector_meta` makes for it (`is_store=False`), bound on the target, then
  `start_load_kv` over the forward context (the registered layers by name, each with its `kv_cache`; per layer
  attention metadata of no MLA class, all ExampleConnector reads of it) and `wait_for_layer_load` per layer.
"""

from __future__ import annotations

import atexit
import random
import shutil
import tempfile
import types
import uuid

CONNECTOR = "ExampleConnector"


def transfer_config(storage: str) -> dict[str, object]:
    """What a user sets with `--kv-transfer-config` to use ExampleConnector over the directory `storage`."""
    return {"kv_connector": CONNECTOR, "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": storage}}


class VllmExample:
    """vLLM's ExampleConnector, a side per allocation, both over one storage directory of this process."""

    name = "vllm-example"
    capabilities = frozenset({"connector"})
    needs_vllm = "ExampleConnector is vLLM's KVConnectorBase_V1, built with vLLM's VllmConfig and KVCacheConfig"
    storage: str | None = None

    def connector(self, kv_cache_config, layers) -> ExampleSide:
        if VllmExample.storage is None:
            VllmExample.storage = tempfile.mkdtemp(prefix="kvconform-example-connector-")
            atexit.register(shutil.rmtree, VllmExample.storage, True)
        return ExampleSide(kv_cache_config, list(layers), VllmExample.storage)


class ExampleSide:
    """One ExampleConnector of the worker role, as vLLM's factory builds it."""

    def __init__(self, kv_cache_config, attention: list[str], storage: str) -> None:
        from vllm.config import KVTransferConfig, get_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        self.vllm_config = get_current_vllm_config()
        self.vllm_config.kv_transfer_config = KVTransferConfig(**transfer_config(storage))
        if len(kv_cache_config.kv_cache_groups) == 1 and \
                not KVConnectorFactory.supports_hma_config(self.vllm_config.kv_transfer_config):
            self.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True
        self.block_size = self.vllm_config.cache_config.block_size
        self.attention = attention
        self.worker = KVConnectorFactory.create_connector(self.vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        self.layers: dict[str, types.SimpleNamespace] = {}

    def register_kv_caches(self, kv_caches) -> None:
        self.worker.register_kv_caches(kv_caches)
        self.layers = {name: types.SimpleNamespace(kv_cache=cache) for name, cache in kv_caches.items()}

    def save(self, block_ids) -> list[int]:
        (ids,) = block_ids
        rng = random.Random(uuid.uuid4().int)
        tokens = [rng.randrange(1 << 30) for _ in range(len(ids) * self.block_size + 1)]
        self.worker.bind_connector_metadata(self._request(tokens, ids, is_store=True))
        try:
            for name in self.attention:
                self.worker.save_kv_layer(name, self.layers[name].kv_cache, object())
            self.worker.wait_for_save()
        finally:
            self.worker.clear_connector_metadata()
        return tokens

    def load(self, block_ids, tokens: list[int]) -> None:
        (ids,) = block_ids
        self.worker.bind_connector_metadata(self._request(tokens, ids, is_store=False))
        context = types.SimpleNamespace(no_compile_layers=self.layers,
                                        attn_metadata={name: object() for name in self.layers})
        try:
            self.worker.start_load_kv(context)
            for name in self.attention:
                self.worker.wait_for_layer_load(name)
        finally:
            self.worker.clear_connector_metadata()

    def _request(self, tokens: list[int], ids, is_store: bool):
        """The metadata build_connector_meta makes for one new request of these tokens at block ids `ids`."""
        from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnectorMetadata

        meta = ExampleConnectorMetadata()
        meta.add_request(token_ids=tokens, block_ids=ids.tolist(), block_size=self.block_size, is_store=is_store,
                         mm_hashes=[])
        return meta
