"""The lmcache-mp subject's cells are LMCache's own decisions: the line of LMCache that decides a cell, changed in a
copy of the installed package, flips that cell of the connector suite; and the adapter makes its requests as
LMCache's own scheduler side makes them. Needs LMCache and a vLLM release installed
(`nox -s connectors` runs this file in each venv it builds); skipped, saying so, elsewhere."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import shutil
from pathlib import Path

import pytest
from cells import calls, outcomes

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lmcache") is None or importlib.util.find_spec("vllm") is None,
    reason="LMCache and vLLM are not both installed: `nox -s connectors -- 0.33.0` installs them and runs this")

# LMCache 0.5.6, lmcache/integration/vllm/kv_cache_group_edits.py:666 (0.4.7: :385, the same two lines), in
# apply_kv_cache_group_edits: no group's views are edited (the sub-paged attention edit among them) unless the model
# has Mamba layers.
EDITS = "lmcache/integration/vllm/kv_cache_group_edits.py"
MAMBA_ONLY = "    if kv_cache_config is None or not kv_cache_config.has_mamba_layers:\n        return dict(kv_caches)\n"
ALWAYS = "    if kv_cache_config is None:\n        return dict(kv_caches)\n"
# LMCache 0.4.7, the same file :289, in _SubpagedAttentionViewEdit.matches: the sub-paged attention edit takes only
# 5-dim tensors (0.5.6: `in (5, 4)`), and its apply only contiguous ones.
FIVE_DIM_ONLY = "            and kv_cache.ndim == 5\n"


@pytest.mark.parametrize("model", ["kernel-split"])
def test_the_mamba_only_edit_decides_the_kernel_split_cell(tmp_path, model):
    version = importlib.metadata.version("lmcache")
    package = Path(importlib.util.find_spec("lmcache").submodule_search_locations[0])
    copy = tmp_path / "lmcache-patched"
    shutil.copytree(package, copy / "lmcache", ignore=shutil.ignore_patterns("__pycache__"))
    edits = copy / EDITS
    text = edits.read_text()
    assert text.count(MAMBA_ONLY) == 1, (f"LMCache {version}'s {EDITS} no longer returns early without Mamba layers "
                                         f"as 0.5.6 and 0.4.7 do: re-read it, and the known finding lmcache-mp#1")
    if FIVE_DIM_ONLY in text:
        pytest.skip(f"LMCache {version} has the same Mamba-only early return ({EDITS}:385), but its sub-paged "
                    f"attention edit is not 0.5.6's: it matches only 5-dim tensors (`kv_cache.ndim == 5`, :289; "
                    f"0.5.6 takes 4-dim ones too) and re-views only contiguous ones. Measured without the return: on "
                    f"vLLM 0.33.0 (4-dim kernel-split caches) the cell still differs, and with 4-dim ones matched "
                    f"too the edit refuses them as not contiguous (unsupported); on vLLM 0.25.1 (5-dim caches) the "
                    f"examples turn bit-identical but the server's L1 runs out (64 MiB objects per chunk) and a "
                    f"lookup finds 0 tokens (subject-error). No one line flips the cell to green in {version}.")
    edits.write_text(text.replace(MAMBA_ONLY, ALWAYS))
    released, log = outcomes(tmp_path / "released", "lmcache-mp", model)
    assert released == {"differs"}, log
    patched, log = outcomes(tmp_path / "patched", "lmcache-mp", model, copy)
    # and the known finding that predicts the difference (lmcache-mp#1) is reported stale
    assert patched == {"bit-identical", "stale"}, log


def test_the_adapter_calls_what_lmcache_s_own_scheduler_side_and_registration_call():
    """kvconform.subjects.lmcache_mp makes the STORE and RETRIEVE requests as the installed LMCache's scheduler side
    does (GetStoreMetadata, GetRetrieveMetadata: 0.5.6's lmcache_mp_metadata.py, 0.4.7's lmcache_mp_connector.py),
    sizes chunks and blocks as its connector does, and lets register_kv_caches edit the views as it does itself; a
    release of LMCache that builds them otherwise fails here, naming the method."""
    import dataclasses

    from lmcache.integration.vllm import lmcache_mp_connector as mp

    from kvconform.subjects.lmcache_mp import metadata_classes

    _, LMCacheMPRequestMetadata = metadata_classes()
    op = {"token_ids", "block_ids", "start", "end"}
    # request_configs (0.5.6, not in 0.4.7): LMCache passes the request's per-request settings, the adapter leaves
    # the field at its default (no per-request settings).
    configs = {"request_configs"} & {f.name for f in dataclasses.fields(LMCacheMPRequestMetadata)}
    request = {"request_id", "direction", "op", "cache_salt"} | configs
    for method, extra in [(LMCacheMPRequestMetadata.GetStoreMetadata, set()),
                          (LMCacheMPRequestMetadata.GetRetrieveMetadata, {"skip_first_n_tokens"})]:
        made = calls(method)
        assert "slice_block_ids_per_group" in made, method.__qualname__
        # The adapter passes start, end and the blocks of [start, end); the tokens skipped on retrieve are those vLLM
        # had cached itself (none here).
        assert made.get("LoadStoreOp") == op | extra, (method.__qualname__, made.get("LoadStoreOp"))
        assert made.get("LMCacheMPRequestMetadata") == request, (method.__qualname__,
                                                                 made.get("LMCacheMPRequestMetadata"))
    registered = calls(mp.LMCacheMPConnector.register_kv_caches)
    assert {"apply_kv_cache_group_edits", "create_engine_group_infos_from_vllm"} <= set(registered), registered
    init = mp.LMCacheMPConnector.__init__
    if hasattr(mp, "get_vllm_scheduler_block_size"):
        # 0.5.6: the connector sizes chunks and blocks with the helpers the adapter calls (chunk_and_tokens_per_block)
        assert {"get_group_tokens_per_block", "get_vllm_scheduler_block_size"} <= set(calls(init)), init.__qualname__
    else:
        # 0.4.7: no helper; the adapter reads each group's tokens per block, and the block sizes the chunk must be a
        # multiple of, as __init__ does inline
        flat = " ".join(inspect.getsource(init).split())
        for read in ["[ group.kv_cache_spec.block_size for group in vllm_groups ] or "
                     "[vllm_config.cache_config.block_size]",
                     "vllm_block_size=vllm_config.cache_config.block_size",
                     "if lmcache_tokens_per_chunk % tokens_per_block != 0:"]:
            assert read in flat, (init.__qualname__, read)
