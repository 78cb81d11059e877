"""The vllm-example subject's cells are vLLM's own decisions: ExampleConnector's slot rule, changed in a copy of its
module, flips the kernel-split cell of the connector suite; and the adapter calls ExampleConnector as vLLM's
scheduler side, model runner and attention layers call it. Needs a vLLM release installed (`nox -s connectors` runs
this file in each venv it builds); skipped, saying so, elsewhere."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import textwrap
from pathlib import Path

import pytest
from cells import calls, outcomes

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed: `nox -s connectors -- 0.33.0` installs it and runs this")

MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"
# ExampleConnector (0.25.1 - 0.33.0), extract_kv_from_layer and inject_kv_into_layer: a slot's block and offset are
# taken with the scheduler's block size, then index the layer's view, whose blocks are the kernel's.
BY_MANAGER = re.compile(r"block_idxs = slot_mapping // self\._block_size\n(\s*)offsets = slot_mapping % "
                        r"self\._block_size\n(\s*)(return )?(\w+)\[block_idxs")
# The same with the tokens of the view's own block: axis 2 of its [blocks, ., tokens, ...] view.
BY_KERNEL = r"block_idxs = slot_mapping // \4.shape[2]\n\1offsets = slot_mapping % \4.shape[2]\n\2\3\4[block_idxs"
# Loaded by pytest before the suite runs: the changed copy stands for ExampleConnector's module.
PLUGIN = """import importlib.util
import sys

spec = importlib.util.spec_from_file_location({module!r}, {path!r})
module = importlib.util.module_from_spec(spec)
sys.modules[{module!r}] = module
spec.loader.exec_module(module)
"""


def test_the_slot_rule_decides_the_kernel_split_cell(tmp_path):
    source = Path(importlib.util.find_spec(MODULE).origin).read_text()
    changed, n = BY_MANAGER.subn(BY_KERNEL, source)
    assert n == 2, (f"{MODULE} no longer takes a slot's block and offset with self._block_size in both "
                    "extract_kv_from_layer and inject_kv_into_layer: re-read it, and the known finding vllm-example#1")
    copy = tmp_path / "patched"
    copy.mkdir()
    (copy / "example_connector.py").write_text(changed)
    (copy / "kvconform_patched_example.py").write_text(PLUGIN.format(module=MODULE,
                                                                      path=str(copy / "example_connector.py")))
    released, log = outcomes(tmp_path / "released", "vllm-example", "kernel-split")
    assert released == {"subject-error"}, log
    patched, log = outcomes(tmp_path / "patched-run", "vllm-example", "kernel-split", copy,
                            "kvconform_patched_example")
    # and the known finding that predicts the error (vllm-example#1) is reported stale
    assert patched == {"bit-identical", "stale"}, log


def test_the_adapter_calls_what_vllm_s_scheduler_side_runner_and_layers_call():
    """kvconform.subjects.vllm_example makes its requests as ExampleConnector's build_connector_meta does (with the
    block size its __init__ reads), saves each layer with what vLLM's attention layers pass, and hands start_load_kv
    a forward context holding what it reads; a release that does these otherwise fails here, naming what changed."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector
    from vllm.model_executor.layers.attention import kv_transfer_utils

    assert calls(ExampleConnector.build_connector_meta).get("add_request") == {
        "token_ids", "block_ids", "block_size", "is_store", "mm_hashes"}
    assert "self._block_size = vllm_config.cache_config.block_size" in inspect.getsource(ExampleConnector.__init__)
    assert "connector.save_kv_layer(layer_name, kv_cache, attn_metadata)" in inspect.getsource(kv_transfer_utils)
    tree = ast.parse(textwrap.dedent(inspect.getsource(ExampleConnector.start_load_kv)))
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "forward_context"}
    assert read == {"attn_metadata", "no_compile_layers"}, read
