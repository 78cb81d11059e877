"""The model-transfer check (harness.checks.model_transfer over harness.handed.model) can fail, and fails exactly where
it should: each connector-side gallery consumer (examples/breakages: lmcache_4701, flat_regions, stated_order,
kvcached_417) is caught exactly where its rule, stated from the allocation record and the example's block ids, says,
over every recording, its twin nowhere; planted faults of each kind (a save that writes, a load that writes nothing,
one that writes a neighbour, a payload that aliases the source, a registration that changes a tensor's shape, a
connector that moves a private copy), and a layout the recording does not state, are each caught with a diagnosis
that names the layer (and block); a connector that re-points the storage of the tensors it registers passes; a
connector that needs vLLM's own classes is not run in a replay; the installed release's KV cache config is handed
only where it reads as the recorded one; the scheduler's block ids: as many per group, from one pool, never the null
block; a REPRO line, pasted as printed, replays the one failing item.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
import torch

from harness import checks
from harness.checks import model_transfer, transfer
from harness.contract import ContractError, views
from harness.handed import model
from harness.matrix import version_key
from harness.probe.observe import MODEL_DTYPE
from harness.recordings import store
from harness.results import findings
from harness.run import implementation, loop
from harness.run import session as sessions
from harness.run.regressions import Regression
from harness.run.releases import load_release

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))
from block_mover import BlockMover  # noqa: E402
from breakages import flat_regions, kvcached_417, lmcache_4701, stated_order  # noqa: E402

SEEDS = (0, 1, 5)  # every manager block moved, then two subsets


def _moved(target, seed: int) -> set[int]:
    """The KV cache groups the example moves blocks of."""
    m = target.model
    return {g for g, (src, _) in enumerate(model_transfer.group_moves(len(m.config.kv_cache_groups), m.num_blocks,
                                                                      seed)) if src}


def _split(target, seed: int) -> bool:
    """The rule of LMCache #4701: some K/V layer whose manager block holds several kernel blocks has blocks moved."""
    return any(h.kv.layer.manager_block_size != h.kv.layer.block_size and h.group in _moved(target, seed)
               for h in target.model.kv)


def _memory_order(h) -> list[str]:
    """The axes of a K/V layer's recorded view longer than 1, outermost first by their byte strides."""
    (view,) = h.views
    named = dict(zip(h.kv.contract.layout.logical, zip(view["shape"], view["stride_bytes"])))
    return sorted((a for a, (n, _) in named.items() if n > 1), key=lambda a: -named[a][1])


def _unstated_order(target, seed: int) -> bool:
    """Some K/V layer's view is ordered in memory otherwise than its backend states (the contract's order): the
    connector refuses it whether or not its group has blocks moved."""
    return any(_memory_order(h) != [a for a in h.kv.contract.layout.physical if a in _memory_order(h)]
               for h in target.model.kv)


def _flat(view, block_axis: int) -> bool:
    """A recorded view that is one contiguous region with its blocks outermost."""
    shape, stride = view["shape"], view["stride_bytes"]
    size, want = getattr(torch, view["dtype"]).itemsize, []
    for n in reversed(shape):
        want.insert(0, size)
        size *= n
    return block_axis == 0 and all(n == 1 or s == w for n, s, w in zip(shape, stride, want))


def _contiguous(view) -> bool:
    """A recorded view whose elements are one region in their logical order (`view(-1)` takes it)."""
    return _flat(view, 0)


def _not_flat_blocks(target, seed: int) -> bool:
    """Some handed tensor is not one contiguous region (`view(-1)` raises, whatever is moved), or is one whose blocks
    are not outermost while its group has blocks moved (rows of `shape[0]` are not its blocks)."""
    return any(not _contiguous(v) or (not _flat(v, h.block_axis) and h.group in _moved(target, seed))
               for h in target.model.handed for v in h.views)


def _unowned(target, seed: int) -> bool:
    """Some layer of a KV cache group is named by no KVCacheTensor's shared_by (a layer sharing another's cache)."""
    c = target.model.config
    owners = {n for t in c.kv_cache_tensors for n in t.shared_by}
    return any(n not in owners for g in c.kv_cache_groups for n in g.layer_names)


RULES = {lmcache_4701.ManagerIdsAsKernelIds: _split, stated_order.StatedOrderOnly: _unstated_order,
         flat_regions.FlatRegions: _not_flat_blocks, kvcached_417.EveryGroupLayerOwnsATensor: _unowned}
TWINS = (BlockMover, lmcache_4701.KernelBlocksOfManagerBlock, stated_order.TensorsOwnOrder, flat_regions.ThroughViews,
         kvcached_417.OwnersBound)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("connector")
    return sessions.start("block_mover:BlockMover", ["recorded"], store.ROOT, tmp / "results", tmp / "regressions",
                          findings.DIRECTORY, "cpu", "test", "")


def _outcome(s, target, seed: int):
    """The outcome of one example, run as the suite runs it (None when it passed)."""
    try:
        loop.Loop(s, "test").replay(Regression(target, model_transfer.Moves(target.model.name, seed), None, ""),
                                    checks.MODEL_TRANSFER)
    except loop.NewFinding as e:
        return str(e)
    return None


def _verdicts(session, subject) -> dict[tuple[str, str, int], str | None]:
    s = dataclasses.replace(session, subject=subject(), subject_name=subject.name)
    return {(t.release.release, t.model.name, seed): _outcome(s, t, seed)
            for t in implementation.targets(s, checks.MODEL_TRANSFER) for seed in SEEDS}


def test_models_of_every_read_release_are_targets_and_the_rest_say_why(session):
    targets = implementation.targets(session, checks.MODEL_TRANSFER)
    by_release = Counter(t.release.release for t in targets)
    for r in session.releases:
        taken, outside = model_transfer.models_of(r)
        assert by_release[r.release] == len(taken)
        if r.allocations and r.allocations.get("read"):
            assert {"uniform", "kernel-split"} <= {m.name for m in taken}, r.release
            assert "mla-indexer" in outside and "padded-split" in outside, (r.release, outside)
        else:
            assert not taken and "not read" in outside["*"], r.release
    assert len(by_release) == 24 and sum(by_release.values()) > 150


@pytest.mark.parametrize("subject", list(RULES), ids=lambda s: s.__name__)
def test_each_connector_breakage_is_caught_exactly_where_its_rule_says(session, subject):
    rule = RULES[subject]
    targets = {(t.release.release, t.model.name): t for t in implementation.targets(session, checks.MODEL_TRANSFER)}
    verdicts = _verdicts(session, subject)
    mismatches = sorted(k for k, got in verdicts.items() if (got is not None) != rule(targets[k[:2]], k[2]))
    assert not mismatches, (len(mismatches), mismatches[:10])
    caught = Counter(k[1] for k, got in verdicts.items() if got)
    assert caught, f"{subject.__name__} is caught nowhere"
    print(f"{subject.__name__}: caught on {sum(caught.values())} of {len(verdicts)} examples ({dict(caught)})")


@pytest.mark.parametrize("twin", TWINS, ids=lambda s: s.__name__)
def test_each_twin_passes_everywhere(session, twin):
    verdicts = _verdicts(session, twin)
    assert verdicts and not [k for k, got in verdicts.items() if got], [v for v in verdicts.values() if v][:3]


def _target(session, release: str, name: str):
    return next(t for t in implementation.targets(session, checks.MODEL_TRANSFER)
                if t.release.release == release and t.model.name == name)


class WritesTheSource(BlockMover):
    name = "writes-the-source"

    def take(self, tensor, layer, block_ids):
        out = super().take(tensor, layer, block_ids)
        if layer is not None:
            tensor[0, 0, 0, 0] = 0  # one float16 element
        return out


class LoadsNothing(BlockMover):
    name = "loads-nothing"

    def put(self, tensor, layer, block_ids, data):
        pass


class WritesANeighbour(BlockMover):
    """Also writes the first kernel block it was not asked for, in each K/V layer."""

    name = "writes-a-neighbour"

    def put(self, tensor, layer, block_ids, data):
        super().put(tensor, layer, block_ids, data)
        if layer is not None:
            axis, asked = self.block_axis(layer), set(self.kernel_ids(layer, block_ids).tolist())
            tensor.select(axis, next(b for b in range(tensor.shape[axis]) if b not in asked)).zero_()


class AliasesTheSource(BlockMover):
    """Its payload is the source's views and ids, read at load: the source's reuse has overwritten them."""

    name = "aliases-the-source"

    def take(self, tensor, layer, block_ids):
        return tensor, self.blocks(tensor, layer, block_ids)

    def put(self, tensor, layer, block_ids, data):
        source, (axis, ids) = data
        tensor.index_copy_(axis, self.blocks(tensor, layer, block_ids)[1], source.index_select(axis, ids))


class MovesAPrivateCopy(BlockMover):
    """Registers copies of the tensors it is handed and moves blocks between those: vLLM's never change."""

    name = "moves-a-private-copy"

    def register_kv_caches(self, kv_caches):
        super().register_kv_caches({n: [t.clone() for t in x] if isinstance(x, list) else x.clone()
                                    for n, x in kv_caches.items()})


class PermutesOnRegister(BlockMover):
    """Re-points every registered tensor at its own storage in its memory order (its axes sorted by stride, as
    LMCache's CPU shared-memory registration does): the layers' tensors change shape."""

    name = "permutes-on-register"

    def register_kv_caches(self, kv_caches):
        for x in kv_caches.values():
            for t in x if isinstance(x, list) else [x]:
                order = sorted(range(t.dim()), key=lambda a: -t.stride(a))
                p = t.permute(order)
                t.set_(t.untyped_storage(), t.storage_offset(), p.shape, p.stride())
        super().register_kv_caches(kv_caches)


class RepointsStorage(BlockMover):
    """Moves every registered tensor's bytes into storage of its own and re-points the tensor at it, in place (as
    LMCache migrates caches to shared memory): vLLM's tensors then read the new storage."""

    name = "repoints-storage"

    def register_kv_caches(self, kv_caches):
        for x in kv_caches.values():
            for t in x if isinstance(x, list) else [x]:
                t.set_(t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride())
        super().register_kv_caches(kv_caches)


def test_a_connector_that_repoints_storage_passes_and_one_that_moves_a_private_copy_fails(session):
    for model_name in ("kernel-split", "hybrid-split"):
        t = _target(session, "0.33.0", model_name)
        s = dataclasses.replace(session, subject=RepointsStorage(), subject_name=RepointsStorage.name)
        assert _outcome(s, t, 0) is None
        s = dataclasses.replace(session, subject=MovesAPrivateCopy(), subject_name=MovesAPrivateCopy.name)
        got = _outcome(s, t, 0)
        assert got is not None and "still the poison they were given" in got, got


@pytest.mark.parametrize("subject, said", [
    (WritesTheSource, "changed 1 elements of layer layers.0's tensor 0 on the source"),
    (LoadsNothing, "every element of the target's handed tensors is still the poison"),
    (WritesANeighbour, "changed although nothing was loaded there"),
    (AliasesTheSource, "a payload that aliases the source reads its reused, poisoned blocks"),
    (PermutesOnRegister, "register_kv_caches changed layer layers.0's tensor 0 from shape [20, 2, 64, 64] byte "
                         "strides"),
], ids=lambda x: getattr(x, "__name__", ""))
def test_planted_faults_are_caught_with_what_and_where(session, subject, said):
    s = dataclasses.replace(session, subject=subject(), subject_name=subject.name)
    got = _outcome(s, _target(session, "0.33.0", "kernel-split"), 1)
    assert got is not None and said in got, got
    said_repro = "REPRO model-transfer release=0.33.0 (replay) geometry=model:kernel-split model=kernel-split seed=1"
    assert said_repro in got, got
    if subject is WritesANeighbour:
        assert re.search(r" at layer=layers\.\d block=\d kernel_block=\d+ :: ", got), got


def test_a_layout_unlike_the_record_fails_the_right_connector(session):
    # The recording says manager block m holds kernel blocks m*4 .. m*4+3; a release that ordered them otherwise
    # (here: interleaved, m, m+5, m+10, m+15) would make the rule the connector follows wrong, and the check says so.
    t = _target(session, "0.33.0", "kernel-split")
    n = t.model.num_blocks
    scattered = tuple(tuple(m + n * j for j in range(4)) for m in range(n))
    broken = dataclasses.replace(t.model, handed=tuple(dataclasses.replace(h, kernel_blocks=scattered)
                                                       for h in t.model.handed))
    got = _outcome(session, dataclasses.replace(t, model=broken), 0)
    assert got is not None and "layer layers.0: kernel block" in got, got
    assert _outcome(session, t, 0) is None


def test_unsupported_layers_are_unsupported_never_a_pass(session):
    class NoSplits(BlockMover):
        name = "no-splits"

        def supports_layer(self, layer):
            return "kernel blocks inside manager blocks" if layer.manager_block_size != layer.block_size else None

    s = dataclasses.replace(session, subject=NoSplits(), subject_name=NoSplits.name)
    state = loop.Loop(s, "test").replay(Regression(_target(session, "0.33.0", "kernel-split"),
                                                   model_transfer.Moves("kernel-split", 0), None, ""),
                                        checks.MODEL_TRANSFER)
    assert state.ran == 0 and state.unsupported == {"layers.0: kernel blocks inside manager blocks"}


@pytest.mark.parametrize("error, word", [(ValueError, "unsupported"), (NotImplementedError, "unsupported"),
                                         (KeyError, "subject-error")])
def test_a_connector_refusing_the_model_at_registration_is_unsupported_in_its_words(session, error, word):
    class Refuses(BlockMover):
        name = "refuses"

        def register_kv_caches(self, kv_caches):
            raise error("cannot serve this model's KV cache groups")

    s = dataclasses.replace(session, subject=Refuses(), subject_name=Refuses.name)
    got = _outcome(s, _target(session, "0.33.0", "hybrid"), 0)
    if word == "unsupported":
        state = loop.Loop(s, "test").replay(Regression(_target(session, "0.33.0", "hybrid"),
                                                       model_transfer.Moves("hybrid", 0), None, ""),
                                            checks.MODEL_TRANSFER)
        assert got is None and state.ran == 0, got
        assert state.unsupported == {f"register_kv_caches: {error.__name__}: cannot serve this model's KV cache "
                                     "groups"}, state.unsupported
    else:
        assert got is not None and got.startswith("subject-error: KeyError"), got


def test_a_connector_that_needs_vllm_is_not_run_in_a_replay_never_passed(session):
    class NeedsVllm(BlockMover):
        name = "needs-vllm"
        needs_vllm = "isinstance on vLLM's spec classes"

    s = dataclasses.replace(session, subject=NeedsVllm(), subject_name=NeedsVllm.name)
    state = loop.Loop(s, "test").replay(Regression(_target(session, "0.33.0", "hybrid-split"),
                                                   model_transfer.Moves("hybrid-split", 0), None, ""),
                                        checks.MODEL_TRANSFER)
    assert state.ran == 0 and state.failure is None
    (why,) = state.not_run
    assert why.startswith("needs-vllm needs vLLM's own classes (isinstance on vLLM's spec classes); a replay hands "
                          "it the recorded stand-in KV cache config") and "vllm==0.33.0 installed" in why, why


def test_the_installed_release_s_config_is_handed_where_it_reads_as_the_recorded_one():
    r = load_release("0.33.0", store.ROOT)
    m = next(x for x in model_transfer.models_of(r)[0] if x.name == "hybrid-split")

    class Spec:  # vLLM's spec classes are named as the recording names them; their other fields are not recorded
        def __init__(self, block_size, page_size_bytes):
            self.block_size, self.page_size_bytes, self.num_kv_heads = block_size, page_size_bytes, 2

    def own(size=None):
        groups = [types.SimpleNamespace(layer_names=list(g.layer_names), kv_cache_spec=type(
            type(g.kv_cache_spec).__name__, (Spec,), {})(size or g.kv_cache_spec.block_size,
                                                         g.kv_cache_spec.page_size_bytes))
                  for g in m.config.kv_cache_groups]
        tensors = [types.SimpleNamespace(size=t.size, layers=list(t.shared_by)) for t in m.config.kv_cache_tensors]
        return types.SimpleNamespace(num_blocks=m.num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)

    assert model.agreeing(m, own()).kv_cache_groups[0].kv_cache_spec.num_kv_heads == 2
    with pytest.raises(ContractError, match=r"vLLM 0.33.0 model hybrid-split: the installed release's KV cache "
                                            r"config .*block_size=128.* is not the recorded .*block_size=256"):
        model.agreeing(m, own(128))


def test_the_layer_value_says_both_block_sizes():
    r = load_release("0.33.0", store.ROOT)
    taken, _ = model_transfer.models_of(r)
    split = next(m for m in taken if m.name == "kernel-split")
    layer = split.kv[0].kv.layer
    assert (layer.block_size, layer.manager_block_size, layer.kv_cache_layout) == (64, 256, "LBNHC")
    assert "manager blocks of 256 tokens" in layer.describe()
    (views,) = model.tensors(split.kv[0], model.allocated(split.allocations, "cpu"))
    assert views.shape[split.kv[0].block_axis] == 20  # 5 manager blocks of 4 kernel blocks


def test_a_failing_connector_prints_a_repro_that_replays_its_one_item(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "examples")])}
    opts = ["-p", "no:cacheprovider", "-q", "--hypothesis-profile=kvconform-ci", "--kvconform-release=0.33.0",
            f"--kvconform-results-dir={tmp_path / 'results'}", f"--kvconform-regressions-dir={tmp_path / 'kept'}",
            "--kvconform-subject=breakages.lmcache_4701:ManagerIdsAsKernelIds", "--kvconform-max-examples=2"]
    done = subprocess.run([sys.executable, "-m", "pytest", *opts, "conformance/test_model_transfer.py", "-rA",
                           "-k", "kernel-split"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:]
    repros = re.findall(r"^E\s+(REPRO .*)$", done.stdout, re.M)
    assert len(repros) == 1, done.stdout[-3000:]
    line = repros[0]
    assert re.match(r"REPRO model-transfer release=0\.33\.0 \(replay\) geometry=model:kernel-split model=kernel-split "
                    r"seed=\d+ at layer=layers\.\d block=\d kernel_block=\d+ :: ", line), line
    command = shlex.split(line.split(" :: ", 1)[1])
    assert command[:3] == [sys.executable, "-m", "pytest"], command  # the interpreter that ran: no venv to activate
    again = subprocess.run([*command, "-rA", "-p", "no:cacheprovider"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 1, again.stdout[-3000:]
    ran = re.findall(r"^(PASSED|FAILED) (\S+)", again.stdout, re.M)
    assert [w for w, _ in ran] == ["FAILED"], again.stdout[-3000:]
    assert "test_model_transfer_regression[0.33.0-model:kernel-split-" in ran[0][1]
    kept = json.loads(next((tmp_path / "kept" / "lmcache-4701-manager-ids").glob("model-transfer-*.json")).read_text())
    assert kept["example"]["model"] == "kernel-split" and kept["geometry"] == "model:kernel-split"


def test_kernels_are_handed_what_a_split_models_layers_get_but_for_old_hybrid_attention(session):
    # What a kernel subject is handed (views.allocate of the layer's contract at its sizes: the contract-level checks'
    # caches) against what each recorded model's K/V layers get, kernel-block splitting and one shared allocation
    # included: the same shape and strides everywhere but a hybrid model's FlashAttention layers up to 0.22.1, whose
    # blocks are outermost in memory (no contract-level check hands a kernel that view).
    unlike = set()
    for t in implementation.targets(session, checks.MODEL_TRANSFER):
        for h in t.model.kv:
            (got,) = model.tensors(h, model.allocated(t.model.allocations, "meta"))
            drawn = views.allocate(h.kv.contract, h.kv.dims, MODEL_DTYPE, "meta")
            if (got.shape, got.stride()) != (drawn.shape, drawn.stride()):
                unlike.add((t.release.release, t.model.name))
    hybrid = {r.release for r in session.releases if version_key(r.release) < version_key("0.23")} - {
        "0.8.5.post1", "0.9.2", "0.10.2"}
    assert unlike == {(r, "hybrid") for r in hybrid}, sorted(unlike)


def test_moves_never_leave_a_block_in_place():
    for seed in range(50):
        src, dst = transfer.moves(list(range(5)), 5, seed)
        assert src and all(s != d for s, d in zip(src, dst)) and len(set(dst)) == len(dst)


@pytest.mark.parametrize("groups", [1, 2])
def test_each_group_gets_as_many_blocks_of_one_pool_never_the_null_block(groups):
    for seed in range(50):
        moves = model_transfer.group_moves(groups, 5, seed)
        counts = {len(src) for src, _ in moves}
        assert len(counts) == 1 and counts.pop() >= 1, moves
        for side in (0, 1):
            ids = [b for x in moves for b in x[side]]
            assert len(set(ids)) == len(ids) and 0 not in ids, moves
        assert all(s != d for src, dst in moves for s, d in zip(src, dst)), moves
    assert sorted(b for src, _ in model_transfer.group_moves(groups, 5, 0) for b in src) == [1, 2, 3, 4]
