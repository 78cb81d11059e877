"""The `lmcache-mp` subject: LMCache's multi-process KV connector and its cache server, unmodified, driven as vLLM
drives a KV connector (a `connector` subject: harness.checks.model_transfer). Live only: it needs the installed
release's own VllmConfig and KVCacheConfig (`needs_vllm`), so a replay says not-run.

What runs is LMCache's code; this adapter only calls its entry points, in the order vLLM and LMCache's own
scheduler side call them:
- the server: `python -m lmcache.v1.multiprocess.server`, one per chunk size, on a free local port, with the options
  a user gives it (`SERVER_OPTIONS`; `--chunk-size` the smallest LMCache accepts for the model: its scheduler block,
  `get_vllm_scheduler_block_size`, so that the moved blocks are whole chunks; `chunk_and_tokens_per_block`);
- a side: `LMCacheMPConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)`, `vllm_config` the release's
  current one (the model's as the release planned it: block size, resolved KV cache layout) with the user's settings
  of `--kv-transfer-config` (`transfer_config`) and a model config that carries only the model's name (the one field
  of it LMCache's connector reads, for its cache keys); then `register_kv_caches` with what vLLM registers;
- save: the STORE request LMCache's scheduler side makes for one request whose tokens cover the blocks
  (`LoadStoreOp` over [0, n), the block ids of each group sliced by LMCache's `slice_block_ids_per_group`), bound
  as the connector's metadata, `wait_for_save()`, then `get_finished` until the store is done; the payload is the
  request's tokens and its cache salt (a fresh one per save, LMCache's per-user isolation);
- load: a scheduler-role connector's lookup of those tokens (`maybe_submit_lookup_request`, `check_lookup_result`:
  a retrieve reads only what a lookup found and locked), then the RETRIEVE request over the tokens found, bound on
  the target, `start_load_kv`, `get_finished` until it is done, and `get_block_ids_with_load_errors`.

Releases: LMCache 0.5.6 and 0.4.7. What differs between them, and only that, is named here: where the request
metadata classes live (`metadata_classes`) and how the chunk size and each group's tokens per block are computed
(`chunk_and_tokens_per_block`: 0.5.6's own helpers; 0.4.7 has none and computes them inline in
`LMCacheMPConnector.__init__`, read here as it reads them).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

# `--supported-transfer-mode auto`: the server serves only LMCache-driven transfers by default, while a CPU worker's
# default (its device's, LMCACHE_MP_TRANSFER_MODE unset) is engine-driven; a user pairs them by serving both. (LMCache
# 0.4.7's server serves both by default, `auto`, and takes the same options.)
SERVER_OPTIONS = ("--l1-size-gb", "1", "--eviction-policy", "LRU", "--disable-observability",
                  "--supported-transfer-mode", "auto")
WAIT_S = 120.0  # how long a request may take before the side says LMCache did not finish it


def transfer_config(port: int) -> dict[str, object]:
    """What a user sets with `--kv-transfer-config` to use LMCache's MP connector against the server at `port`."""
    return {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost", "lmcache.mp.port": port,
                                          "lmcache.mp.mq_timeout": WAIT_S}}


def metadata_classes() -> tuple[type, type]:
    """(LMCacheMPConnectorMetadata, LMCacheMPRequestMetadata) of the installed LMCache: 0.5.6 keeps them in
    lmcache_mp_metadata.py, 0.4.7 in lmcache_mp_connector.py itself."""
    try:
        from lmcache.integration.vllm.lmcache_mp_metadata import (
            LMCacheMPConnectorMetadata,
            LMCacheMPRequestMetadata,
        )
    except ModuleNotFoundError as missing:  # LMCache 0.4.7
        if missing.name != "lmcache.integration.vllm.lmcache_mp_metadata":
            raise
        from lmcache.integration.vllm.lmcache_mp_connector import (
            LMCacheMPConnectorMetadata,
            LMCacheMPRequestMetadata,
        )
    return LMCacheMPConnectorMetadata, LMCacheMPRequestMetadata


def chunk_and_tokens_per_block(vllm_config, kv_cache_config) -> tuple[int, list[int]]:
    """The smallest chunk size the installed LMCache's connector accepts for the model, and the tokens one block id
    covers in each KV cache group, as that release computes them."""
    from lmcache.integration.vllm import lmcache_mp_connector as mp

    if hasattr(mp, "get_vllm_scheduler_block_size"):  # LMCache 0.5.6: its own helpers
        return (mp.get_vllm_scheduler_block_size(vllm_config, kv_cache_config),
                mp.get_group_tokens_per_block(vllm_config, kv_cache_config))
    # LMCache 0.4.7 has no helper for either. Tokens per block: LMCacheMPConnector.__init__, lmcache_mp_connector.py
    # :550-564 (`[group.kv_cache_spec.block_size for group in vllm_groups] or [vllm_config.cache_config.block_size]`,
    # vllm_groups the kv_cache_config's kv_cache_groups). Chunk: the chunk must be a multiple of each of those
    # (lmcache_mp_connector.py:583, and vllm_multi_process_adapter.py:1065 at registration) and of the
    # `vllm_block_size` it hands its adapters, `vllm_config.cache_config.block_size` (lmcache_mp_connector.py:533 and
    # :543, asserted at vllm_multi_process_adapter.py:579 and :985); the least such is their lcm (the lcm of the groups'
    # alone is `_hit_alignment_tokens`, lmcache_mp_connector.py:575).
    tokens_per_block = [group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups] \
        or [vllm_config.cache_config.block_size]
    return math.lcm(vllm_config.cache_config.block_size, *tokens_per_block), tokens_per_block


class _Servers:
    """LMCache cache servers of this process, one per chunk size, stopped when it exits."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[int, subprocess.Popen, Path]] = {}
        atexit.register(self.stop)

    def port(self, chunk_size: int) -> int:
        """The port of a running server of `chunk_size` tokens per chunk (started here if none is)."""
        if chunk_size not in self.running:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            log = Path(tempfile.mkdtemp(prefix="kvconform-lmcache-")) / "server.log"
            proc = subprocess.Popen([sys.executable, "-m", "lmcache.v1.multiprocess.server", "--host", "localhost",
                                     "--port", str(port), "--chunk-size", str(chunk_size), *SERVER_OPTIONS],
                                    stdout=log.open("w"), stderr=subprocess.STDOUT)
            self.running[chunk_size] = (port, proc, log)
        port, proc, log = self.running[chunk_size]
        if proc.poll() is not None:
            raise RuntimeError(f"the LMCache server (chunk size {chunk_size}) exited with {proc.returncode}: "
                               f"{log.read_text()[-2000:]}")
        return port

    def stop(self) -> None:
        for _, proc, _ in self.running.values():
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.running.clear()


class LMCacheMP:
    """LMCache's multi-process connector (lmcache.integration.vllm.lmcache_mp_connector.LMCacheMPConnector)."""

    name = "lmcache-mp"
    capabilities = frozenset({"connector"})
    needs_vllm = "LMCacheMPConnector is vLLM's KVConnectorBase_V1, built with vLLM's VllmConfig and KVCacheConfig"
    servers: _Servers | None = None

    def __init__(self) -> None:
        self.sides: list[Side] = []

    def connector(self, kv_cache_config, layers) -> Side:
        if LMCacheMP.servers is None:
            LMCacheMP.servers = _Servers()
        self.sides.append(Side(kv_cache_config, LMCacheMP.servers))
        # A side's work ends when the next example's begins: the older sides are shut down as vLLM shuts a
        # connector down, the newest two kept (the last one's tensors are read after its load). Only after the new
        # side is built: pyzmq names a socket's monitor endpoint by its file descriptor (`inproc://monitor.s-<fd>`,
        # LMCache's MessageQueueClient monitors its socket, in zmq.Context.instance()), and ZMQ unbinds a closed
        # socket's endpoint later, in its reaper thread; a socket made right after a close can get the freed
        # descriptor while the old endpoint is still bound: `ZMQError: Address already in use`.
        while len(self.sides) > 2:
            self.sides.pop(0).shutdown()
        return self.sides[-1]


class Side:
    """One LMCacheMPConnector of the worker role (and, to load, one of the scheduler role), as vLLM builds them."""

    def __init__(self, kv_cache_config, servers: _Servers) -> None:
        import types

        from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector
        from vllm.config import KVTransferConfig, get_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        self.vllm_config, self.kv_cache_config = get_current_vllm_config(), kv_cache_config
        chunk, self.tokens_per_block = chunk_and_tokens_per_block(self.vllm_config, kv_cache_config)
        self.vllm_config.kv_transfer_config = KVTransferConfig(**transfer_config(servers.port(chunk)))
        self.vllm_config.model_config = types.SimpleNamespace(model="kvconform")
        self.role, self.make = KVConnectorRole, LMCacheMPConnector
        self.worker = LMCacheMPConnector(self.vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        self.scheduler = None

    def register_kv_caches(self, kv_caches) -> None:
        self.worker.register_kv_caches(kv_caches)

    def save(self, block_ids) -> tuple[list[int], str]:
        tokens, salt = list(range(self._tokens(block_ids))), uuid.uuid4().hex
        self._run("STORE", block_ids, tokens, salt, len(tokens))
        return tokens, salt

    def load(self, block_ids, payload: tuple[list[int], str]) -> None:
        tokens, salt = payload
        if self.scheduler is None:
            self.scheduler = self.make(self.vllm_config, self.role.SCHEDULER, self.kv_cache_config)
        request = uuid.uuid4().hex
        self.scheduler.scheduler_adapter.maybe_submit_lookup_request(request, tokens, cache_salt=salt)
        found = self._until(lambda: self.scheduler.scheduler_adapter.check_lookup_result(request), "lookup")
        if found != len(tokens):
            raise RuntimeError(f"LMCache's lookup found {found} of the {len(tokens)} tokens stored")
        self._run("RETRIEVE", block_ids, tokens, salt, found, request)
        if errors := self.worker.get_block_ids_with_load_errors():
            raise RuntimeError(f"LMCache reports load errors at block ids {sorted(errors)}")

    def shutdown(self) -> None:
        for c in (self.worker, self.scheduler):
            if c is not None:
                c.shutdown()

    def _tokens(self, block_ids) -> int:
        covered = {len(ids) * n for ids, n in zip(block_ids, self.tokens_per_block) if n > 0}
        if len(covered) != 1:
            raise ValueError(f"block ids {[x.tolist() for x in block_ids]} cover {sorted(covered)} tokens per group "
                             f"at {self.tokens_per_block} tokens per block: not one request's")
        return covered.pop()

    def _run(self, direction: str, block_ids, tokens: list[int], salt: str, end: int, request: str = "") -> None:
        """One STORE or RETRIEVE request over tokens [0, end) at these blocks, as LMCache's scheduler side makes it
        and vLLM's worker runs it."""
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp
        from lmcache.v1.multiprocess.group_view import slice_block_ids_per_group

        LMCacheMPConnectorMetadata, LMCacheMPRequestMetadata = metadata_classes()
        request = request or uuid.uuid4().hex
        blocks = slice_block_ids_per_group({g: x.tolist() for g, x in enumerate(block_ids)}, self.tokens_per_block,
                                           0, end)
        metadata = LMCacheMPConnectorMetadata()
        metadata.add_request_metadata(LMCacheMPRequestMetadata(request, direction, LoadStoreOp(tokens, blocks, 0, end),
                                                               cache_salt=salt))
        self.worker.bind_connector_metadata(metadata)
        try:
            if direction == "STORE":
                self.worker.wait_for_save()
            else:
                self.worker.start_load_kv(None)
        finally:
            self.worker.clear_connector_metadata()
        done = 0 if direction == "STORE" else 1
        self._until(lambda: request in (self.worker.get_finished({request})[done] or ()) or None, direction)

    @staticmethod
    def _until(poll, what: str):
        deadline = time.monotonic() + WAIT_S
        while (got := poll()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"LMCache did not finish the {what} within {WAIT_S:g} s")
            time.sleep(0.01)
        return got
