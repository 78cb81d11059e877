"""Blocks the subject extracts under one layout setting of a release and injects under another (an offload or
connector cache written under one KVCacheLayout or VLLM_KV_CACHE_LAYOUT, read under another) hold the same K and
V, token by token, read through the second setting's views; or the subject refuses the inject with an error and
leaves the target untouched. A raw copy of a block's bytes passes every size check (both settings' blocks hold the
same bytes) and moves values wherever the two settings order a block's memory differently.

Targets are pairs of geometries of one release, backend, cache dtype and layer arrangement
(harness.run.targets.relayout_targets).
"""

from harness import checks, transfer

CHECK = checks.RELAYOUT  # its declaration: what it needs, costs and draws


def check(t):
    to, layer = t.peer
    return transfer.moved(t, to, layer, refusable=True)


def test_relayout(conformance, target):
    conformance.run(target, CHECK, check)


def test_relayout_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
