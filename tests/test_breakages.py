"""The breakage gallery (examples/breakages): each consumer is caught by kvconform's checks exactly where its rule
says, over every recorded release, and each twin nowhere.

A rule is stated from the contract (kvconform's model of what the release hands out), the layer (what a consumer is
handed) and the example's sizes, never from running the consumer: True where the consumer must be caught. Every
recorded geometry (every release, backend and cache dtype) is checked at the sizes where shapes are ambiguous (2
KV heads, 2 blocks, block size == head size) and at plainer ones (1 KV head, 5 blocks), a diff-KV cache's V
narrower than K at 2 blocks and wider at 5, each example through the check's own function (conformance/), as the
suites run it.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness import checks
from harness.contract import views
from harness.draws.cases import Case
from harness.draws.strategies import Example
from harness.handed.layer import Layer
from harness.recordings import store
from harness.results import findings
from harness.run import implementation, loop
from harness.run import session as sessions
from harness.run.regressions import Regression
from harness.run.targets import InModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from breakages import (  # noqa: E402
    diffkv_v_width,
    dynamo_12750,
    flexkv_187,
    fp8_type,
    kvcached_424,
    lmcache_4463,
    lmcache_4729,
    nixl_hetero_tp,
    vllm_49011,
    vllm_55904,
)

SIZES = [(kv_heads, blocks) for kv_heads in (2, 1) for blocks in (2, 5)]  # (KV heads, num_blocks)
CORNERS = [(2, 2), (1, 5)]  # the most ambiguous sizes and the plainest
BLOCK = HEAD = 64  # block size == head size
V_HEAD = {2: 32, 5: 96}  # diff-KV: V's head size by num_blocks, narrower than K's and wider


def _shown(c, dims, axes) -> list[str]:
    """`axes` without those of size 1 at `dims` (they address nothing)."""
    return [a for a in axes if views.size(c, a, dims) > 1]


def _memory(c, dims) -> list[str]:
    """The layer's axes in memory order as a consumer addressing it from its first element meets them: its
    contract's physical order without the axes of size 1, and without L where L is outermost (each layer's view is
    then a contiguous block)."""
    order = _shown(c, dims, c.layout.physical)
    return order[1:] if order[:1] == ["L"] else order


def _heads_outside(logical, outside: bool) -> list[str]:
    order = list(logical)
    n, h = order.index("N"), order.index("H" if "H" in order else "S")
    if (h < n) != outside:
        order[n], order[h] = order[h], order[n]
    return order


def _recorded_hint(layer: Layer) -> str | None:
    """get_kv_cache_layout()'s recorded answer under the layer's setting; None where it has none or refused."""
    module = (layer.recording.api["modules"].get("vllm.v1.attention.backends.utils") or {})
    if "get_kv_cache_layout" not in module.get("names", {}):
        return None
    env = layer.kv_cache_layout if layer.kv_cache_layout in ("NHD", "HND") else None
    answer = next(a for a in module["answers"] if a["call"] == "get_kv_cache_layout" and a["env"] == env)
    return answer.get("result")


def size_two_is_kv(layer, c, dims, peer) -> bool:
    # The first axis of size 2 ahead of the innermost is read as the K/V pair.
    first = next((a for a in c.layout.logical[:-1] if views.size(c, a, dims) == 2), None)
    if len(c.layout.logical) == 5:
        return first != "KV"
    if c.layout.logical == ("B", "S", "N", "D"):
        return first != "S"  # S has size 2 with one KV head: its two slots are K and V
    if c.layout.logical == ("B", "H", "N", "C"):
        return first is not None or (c.diff_kv and dims.v_dim != dims.head_dim)
    return True  # packed-tokens [B, N, H, C]: neither reading fits


# (consumer, check) -> where it must be caught. Written before the gallery was first run.
RULES = {
    (lmcache_4463.SizeTwoIsKV, checks.SPLIT_AGREES): size_two_is_kv,
    (flexkv_187.KvFirst, checks.SPLIT_AGREES): lambda layer, c, dims, peer: c.layout.family != "kv-first",
    (flexkv_187.SizeTwoAtOne, checks.SPLIT_AGREES):
        lambda layer, c, dims, peer: c.layout.family == "kv-first" and dims.num_blocks == 2,
    # A side's stored row is wider than the head (an inline scale, NVFP4's packing) where get_kv_cache_shape is asked.
    (kvcached_424.WithoutCacheDtype, checks.SPLIT_AGREES):
        lambda layer, c, dims, peer: hasattr(layer.backend, "get_kv_cache_shape")
        and c.dtype.width(dims.head_dim) != dims.head_dim,
    # A raw block is right where both settings order a block's memory alike (the axes inside B, L, of size > 1).
    (vllm_55904.RawBlocks, checks.RELAYOUT):
        lambda layer, c, dims, peer: [a for a in _shown(c, dims, c.layout.physical) if a not in ("L", "B")]
        != [a for a in _shown(peer, dims, peer.layout.physical) if a not in ("L", "B")],
    (vllm_55904.RawBlocks, checks.TRANSFER): lambda layer, c, dims, peer: False,
    (lmcache_4729.LayoutHint, checks.SPLIT_AGREES):
        lambda layer, c, dims, peer: _memory(c, dims)
        != _shown(c, dims, _heads_outside(c.layout.logical, _recorded_hint(layer) == "HND")),
    (dynamo_12750.OuterContiguous, checks.SPLIT_AGREES):
        lambda layer, c, dims, peer: "KV" not in c.layout.logical
        or _memory(c, dims) != _shown(c, dims,
                                      ["KV", "B"] + [a for a in c.layout.physical if a not in ("L", "KV", "B")]),
    (nixl_hetero_tp.HeadsOutsideTokens, checks.SPLIT_AGREES):
        lambda layer, c, dims, peer: _memory(c, dims) != _shown(c, dims, _heads_outside(c.layout.logical, True)),
    (vllm_49011.HeadMajorNvfp4, checks.SPLIT_AGREES):
        lambda layer, c, dims, peer: "S" in c.layout.logical
        and _memory(c, dims) != _shown(c, dims, _heads_outside(c.layout.logical, True)),
    # C[..., Dk:2*Dk] ends at C's end, so it is V's view unless C runs on past 2*Dk (V wider than K).
    (diffkv_v_width.VAtKWidth, checks.SPLIT_AGREES):
        lambda layer, c, dims, peer: "C" in c.layout.logical
        and views.size(c, "C", dims) > 2 * c.dtype.width(dims.head_dim),
    (fp8_type.AlwaysE4m3, checks.SPLIT_AGREES): lambda layer, c, dims, peer: c.cache_dtype == "fp8_e5m2",
}
TWINS = {lmcache_4463.StatedLayout: checks.SPLIT_AGREES, flexkv_187.AskedKVAxis: checks.SPLIT_AGREES,
         kvcached_424.WithCacheDtype: checks.SPLIT_AGREES, vllm_55904.ViewBlocks: checks.RELAYOUT,
         lmcache_4729.StatedLayout: checks.SPLIT_AGREES, dynamo_12750.ShapeDetected: checks.SPLIT_AGREES,
         nixl_hetero_tp.StrideOrdered: checks.SPLIT_AGREES, vllm_49011.StatedNvfp4: checks.SPLIT_AGREES,
         diffkv_v_width.VAtOwnWidth: checks.SPLIT_AGREES, fp8_type.ByCacheDtype: checks.SPLIT_AGREES}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("breakages")
    return sessions.start("builtin", ["recorded"], store.ROOT, tmp / "results", tmp / "regressions",
                        findings.DIRECTORY, "cpu", "test", "")


def _examples(target, sizes=SIZES):
    c = target.contract
    peer = getattr(target, "peer", None)  # a relayout pair's second geometry
    layers = (2, 1) if c.layout.shared or (peer is not None and peer.layout.shared) else (1, 0)
    for kv_heads, blocks in sizes:
        case = Case((BLOCK + 1,), (BLOCK + 1,), kv_heads, kv_heads, HEAD, BLOCK, "bfloat16", seed=blocks)
        yield Example(case, c, blocks, *layers, page_order="reversed", head_dim_v=V_HEAD[blocks] if c.diff_kv else 0)


def _verdicts(session, subject, check, sizes=SIZES):
    """(release, geometry, kv heads, blocks) -> (caught, what the rule says) over every target of the check."""
    s = dataclasses.replace(session, subject=subject(), subject_name=subject.name,
                            capabilities=frozenset({"split", "transfer"}))
    rule = RULES.get((subject, check), lambda *_: False)
    out = {}
    # The rules speak of a contract's caches; the views a whole model hands a layer (InModel targets) are
    # tests/test_in_model.py's.
    for target in [t for t in implementation.targets(s, check) if not isinstance(t, InModel)]:
        runs = loop.Loop(s, "test")
        for ex in _examples(target, sizes):
            layer = runs.trial(target, check.name, ex, 0).layer
            try:
                runs.replay(Regression(target, ex, 0, ex.digest()), check)
                caught = False
            except loop.NewFinding:
                caught = True
            out[(target.release.release, target.geometry, ex.case.kv_heads, ex.num_blocks)] = (
                caught, bool(rule(layer, target.contract, ex.dims, getattr(target, "peer", None))))
    return out


def _table(verdicts) -> str:
    caught = Counter(r for (r, *_), (got, _) in verdicts.items() if got)
    return ", ".join(f"{r} {n}" for r, n in caught.items()) or "nowhere"


@pytest.mark.parametrize("subject, check", list(RULES), ids=lambda x: getattr(x, "__name__", getattr(x, "name", x)))
def test_each_breakage_is_caught_exactly_where_its_rule_says(session, subject, check):
    # A raw block copy depends on the KV heads alone (a block's memory order), not on the number of blocks.
    verdicts = _verdicts(session, subject, check, CORNERS if subject is vllm_55904.RawBlocks else SIZES)
    mismatches = sorted(k for k, (got, want) in verdicts.items() if got != want)
    assert not mismatches, (len(mismatches), mismatches[:10])
    caught = [k for k, (got, _) in verdicts.items() if got]
    if not (subject is vllm_55904.RawBlocks and check is checks.TRANSFER):
        assert caught, f"{subject.__name__} is caught nowhere: its rule says nothing"
    print(f"{subject.__name__} {check.name}: caught on {len(caught)} of {len(verdicts)} examples ({_table(verdicts)})")


@pytest.mark.parametrize("twin", list(TWINS), ids=lambda t: t.__name__)
def test_each_twin_passes_everywhere(session, twin):
    verdicts = _verdicts(session, twin, TWINS[twin], CORNERS)
    caught = sorted(k for k, (got, _) in verdicts.items() if got)
    assert verdicts and not caught, caught[:10]
