"""The lmcache-mp subject's cells are LMCache's own decisions: the line of LMCache that decides a cell, changed in a
copy of the installed package, flips that cell of the connector suite; and the adapter makes its requests as
LMCache's own scheduler side makes them. Needs LMCache and a vLLM release installed
(`nox -s connectors` runs this file in each venv it builds); skipped, saying so, elsewhere."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lmcache") is None or importlib.util.find_spec("vllm") is None,
    reason="LMCache and vLLM are not both installed: `nox -s connectors -- 0.33.0` installs them and runs this")

# LMCache 0.5.6, lmcache/integration/vllm/kv_cache_group_edits.py:666, in apply_kv_cache_group_edits: no group's
# views are edited (the sub-paged attention edit among them) unless the model has Mamba layers.
EDITS = "lmcache/integration/vllm/kv_cache_group_edits.py"
MAMBA_ONLY = "    if kv_cache_config is None or not kv_cache_config.has_mamba_layers:\n        return dict(kv_caches)\n"
ALWAYS = "    if kv_cache_config is None:\n        return dict(kv_caches)\n"


def outcomes(tmp_path: Path, model: str, lmcache_dir: Path | None = None) -> tuple[set[str], str]:
    """The outcomes of the connector suite's `model` cell for lmcache-mp on the installed release, and the end of
    its output, with LMCache imported from `lmcache_dir` (a directory holding `lmcache/`) where given, in its server
    as in the connector."""
    out = tmp_path / ("patched" if lmcache_dir else "released")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(lmcache_dir or ""),
                                                                     os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "conformance/test_model_transfer.py", "-q", "-p",
                           "no:cacheprovider", "-k", f"model:{model}]", "--kvconform-subject=lmcache-mp",
                           f"--kvconform-results-dir={out / 'results'}",
                           f"--kvconform-regressions-dir={out / 'regressions'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [json.loads(x) for f in sorted((out / "results").glob("*/results*.jsonl"))
             for x in f.read_text().splitlines() if x.strip()]
    got = {x["outcome"] for x in lines if x["geometry"] == f"model:{model}"}
    return got, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.parametrize("model", ["kernel-split"])
def test_the_mamba_only_edit_decides_the_kernel_split_cell(tmp_path, model):
    version = importlib.metadata.version("lmcache")
    package = Path(importlib.util.find_spec("lmcache").submodule_search_locations[0])
    copy = tmp_path / "lmcache-patched"
    shutil.copytree(package, copy / "lmcache", ignore=shutil.ignore_patterns("__pycache__"))
    edits = copy / EDITS
    text = edits.read_text()
    assert text.count(MAMBA_ONLY) == 1, (f"LMCache {version}'s {EDITS} no longer returns early without Mamba layers "
                                         f"as 0.5.6 does: re-read it, and the known finding lmcache-mp#1")
    edits.write_text(text.replace(MAMBA_ONLY, ALWAYS))
    released, log = outcomes(tmp_path, model)
    assert released == {"differs"}, log
    patched, log = outcomes(tmp_path, model, copy)
    # and the known finding that predicts the difference (lmcache-mp#1) is reported stale
    assert patched == {"bit-identical", "stale"}, log


def _calls(fn) -> dict[str, set[str]]:
    """Each callee `fn`'s source calls by name, with the keywords it passes."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            out.setdefault(name, set()).update(k.arg for k in node.keywords)
    return out


def test_the_adapter_calls_what_lmcache_s_own_scheduler_side_and_registration_call():
    """kvconform.subjects.lmcache_mp makes the STORE and RETRIEVE requests as LMCache's scheduler side does
    (lmcache_mp_metadata.py: GetStoreMetadata, GetRetrieveMetadata) and lets register_kv_caches edit the views as it
    does itself; a release of LMCache that builds them otherwise fails here, naming the method."""
    from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector
    from lmcache.integration.vllm.lmcache_mp_metadata import LMCacheMPRequestMetadata

    op = {"token_ids", "block_ids", "start", "end"}
    request = {"request_id", "direction", "op", "cache_salt", "request_configs"}
    for method, extra in [(LMCacheMPRequestMetadata.GetStoreMetadata, set()),
                          (LMCacheMPRequestMetadata.GetRetrieveMetadata, {"skip_first_n_tokens"})]:
        calls = _calls(method)
        assert "slice_block_ids_per_group" in calls, method.__qualname__
        # The adapter passes start, end and the blocks of [start, end); the tokens skipped on retrieve are those vLLM
        # had cached itself (none here) and request_configs its default (no per-request settings).
        assert calls.get("LoadStoreOp") == op | extra, (method.__qualname__, calls.get("LoadStoreOp"))
        assert calls.get("LMCacheMPRequestMetadata") == request, (method.__qualname__,
                                                                  calls.get("LMCacheMPRequestMetadata"))
    registered = _calls(LMCacheMPConnector.register_kv_caches)
    assert {"apply_kv_cache_group_edits", "create_engine_group_infos_from_vllm"} <= set(registered), registered
