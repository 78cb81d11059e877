"""The year's public KV-layout breakages as kvconform subjects: one small consumer per report, deciding the layout
as the broken code did, beside a twin that decides as its fix does; and coverage cases, consumers wrong in a way no
report names yet, each beside its right twin. They import nothing from kvconform (the shared
machinery is the example offloader's, `examples/offloader.py`); tests/test_breakages.py states where each must be
caught and where it must pass, over every recorded release.

    PYTHONPATH=examples python -m pytest --pyargs kvconform.suites --kvconform-release recorded \\
        --kvconform-subject breakages.flexkv_187:SizeTwoAtOne -k split_agrees

| module | report | the broken decision | caught by |
|---|---|---|---|
| lmcache_4463 | LMCache #4463 (fix #4467) | an axis of size 2 is the K/V pair, else K and V are halves of the innermost | split-agrees |
| flexkv_187 | FlexKV #187 | `KvFirst`: K, V = kv_cache[0], kv_cache[1]; `SizeTwoAtOne` (the fix): shape[1] == 2 is blocks-first | split-agrees |
| kvcached_424 | kvcached #424 | get_kv_cache_shape asked without cache_dtype_str | split-agrees |
| vllm_55904 | vLLM #55904 | a block moved as its bytes, in memory order, between two layout settings | relayout |
| lmcache_4729 | LMCache #4729 | the memory order from get_kv_cache_layout(), NHD where the release has none | split-agrees |
| dynamo_12750 | Dynamo #12750 | a layer-separate cache read as [2, num_blocks, page]: outer and block strides from sizes | split-agrees |
| nixl_hetero_tp | vLLM test_hetero_tp_layout_bug | heads outside tokens in memory (HND), whatever the stride order says | split-agrees |
| vllm_49011 | vLLM #49011 | an NVFP4 cache's page read head-major (K's heads, then V's, each token-minor) | split-agrees |
| diffkv_v_width | coverage case | a diff-KV cache's V read at K's width, C[..., Dk:2*Dk] | split-agrees |
| fp8_type | coverage case | every fp8 cache viewed as e4m3, whatever layer.cache_dtype says | split-agrees |
| lmcache_4701 | LMCache #4701 | the scheduler's block ids index each layer's view (one kernel page per manager block) | model-transfer |
| flat_regions | intel-accel-for-llm #15, vllm-metal #700, vllm-ascend #15814 | a layer's cache is one flat region of `shape[0]` blocks | model-transfer |
| stated_order | coverage case | a layer's view refused unless its memory order is the backend's stated one | model-transfer |
| kvcached_417 | kvcached #417 (fix #472) | each group layer bound to the KVCacheTensor whose shared_by names it | model-transfer |

The connector-side consumers (model-transfer, tests/test_model_transfer.py) meet the whole models of
harness.probe.models. Breakages at that level that no consumer here expresses, and why: vLLM #48412 (a cross-layer
allocation aliasing every layer's per-token-head fp8 scales) and #54877 (padded pages with kernel-block splitting
over-requesting storage) are vLLM's own allocations, recorded by the probe (the cross-layer-fp8 model, the
padded-split refusals and raises in docs/releases.md), not a consumer's decision; vLLM #57661 (NIXL deduplicating
regions by base address) needs two caches handed on one base address with different block lengths, and the
Mooncake heterogeneous-TP head stride needs an attention page padded beyond its size: no recorded model hands a
connector either (padded-split, which would, is refused or raises in every release read).
"""
