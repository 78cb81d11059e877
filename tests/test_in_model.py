"""The kernel checks over the views a whole model hands its layers (harness.run.targets.InModel): which layers are
targets, the caches made of their views, each check judging them rather than refusing them, and the kernel pair
(kvconform.subjects.declared_strides) caught exactly on them."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from harness import checks, results
from harness.contract import ContractError, views
from harness.draws import in_model
from harness.draws.strategies import CPU, explicit
from harness.handed.cache import filled, paging
from harness.handed.layer import contract_of, dims_of, kv_views
from harness.recordings import store
from harness.recordings.api_history import recorded
from harness.results import findings
from harness.run import loop
from harness.run import session as sessions
from harness.run.regressions import Regression
from harness.run.targets import InModel, geometries, in_models
from kvconform.subjects import NAMED
from kvconform.subjects.declared_strides import DeclaredStrides, TensorStrides

# The releases whose runner restrides a hybrid model's kv-first attention caches with blocks outside K/V
# (gpu_model_runner.py's _update_hybrid_attention_mamba_layout) while the backend's stated order keeps K/V outside:
# 0.11.2 to 0.22.1 (the free allocator of 0.29 and the packed caches between hand no such view).
HYBRID_RELEASES = ("0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1", "0.18.1", "0.19.1",
                   "0.20.2", "0.21.0", "0.22.1")
GRID_SIZES = 12  # harness.probe.models.GRID: 3 block counts x 2 block sizes x 1-2 KV heads


def _allocated(release: str, model: str) -> list[dict]:
    """The grid's sizes at which the release allocated `model`, read from the recording itself."""
    body = recorded(release)["observations"]["allocations"]["models"][model]
    return [at for at in body["instances"] if "layers" in at]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("in_model")
    return sessions.start("builtin", ["recorded"], store.ROOT, tmp / "results", tmp / "regressions",
                          findings.DIRECTORY, "cpu", "test", "")


def _with(session, subject):
    return dataclasses.replace(session, subject=subject(), subject_name=subject.name)


# The free allocator's releases place a model's layers side by side in one buffer (vllm/v1/worker/utils.py:
# allocate_kv_cache): each layer after the first of an allocation is at a non-zero offset, with its contract's
# strides. One target per model, its first such layer, the others alike.
SIDE_BY_SIDE = ("0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "main")
BESIDE_THE_FIRST = {"uniform": ("layers.1", ("layers.2", "layers.3")),
                    "kernel-split": ("layers.1", ("layers.2", "layers.3")),
                    "sliding": ("layers.2", ("layers.3",)),  # its full-attention layers 0 and 1 are one group
                    "hybrid": ("layers.2", ()), "hybrid-split": ("layers.2", ()),
                    "shared": ("layers.1", ("layers.2", "layers.3"))}  # layers.3 reuses layers.1's cache


def test_the_targets_are_the_layers_handed_other_strides_or_another_offset(session):
    found = {(t.release.release, t.geometry, t.also, len(t.views)) for t in in_models(session)}
    strides = {(r, "model:hybrid/layers.0", ("layers.2",), len(_allocated(r, "hybrid"))) for r in HYBRID_RELEASES}
    offsets = {(r, f"model:{m}/{first}", also, len(_allocated(r, m)))
               for r in SIDE_BY_SIDE for m, (first, also) in BESIDE_THE_FIRST.items()}
    assert found == strides | offsets
    for r in SIDE_BY_SIDE:  # what the recordings hold: the first layer at offset 0, the named ones past it
        for m, (first, also) in BESIDE_THE_FIRST.items():
            for at in _allocated(r, m):
                offset = {n: x["layer"]["offset_bytes"] for n, x in at["layers"].items()}
                assert offset["layers.0"] == 0 and all(offset[n] > 0 for n in (first, *also)), (r, m, offset)


def test_the_runner_releases_that_cannot_tell_a_2_block_hybrid_cache_apart_refuse_it():
    # vLLM's own answer at 2 blocks, where its K/V axis and block axis are as long: up to 0.19 it refuses.
    refused = {r: [at["refused"]["error"] for at in recorded(r)["observations"]["allocations"]["models"]
                   ["hybrid"]["instances"] if "refused" in at] for r in HYBRID_RELEASES}
    assert all("Fail to determine whether the layout is (2, num_blocks, ...) or (num_blocks, 2, ...)" in e
               for errors in refused.values() for e in errors)
    assert refused["0.12.0"] and not refused["0.22.1"]
    assert len(_allocated("0.22.1", "hybrid")) == GRID_SIZES


def test_a_targets_views_are_its_blocks_outside_kv_at_every_grid_size(session):
    t = next(t for t in in_models(session) if t.release.release == "0.22.1")
    sizes = {(v.kv.dims.num_blocks, v.kv.dims.block_size, v.kv.dims.kv_heads, v.kv.dims.head_dim) for v in t.views}
    assert sizes == {(n, b, h, 128) for n in (2, 3, 5) for b in (64, 128) for h in (1, 2)}
    for v in t.views:
        d, view = v.kv.dims, v.within.view
        page = d.block_size * d.kv_heads * d.head_dim  # one block of K (or V)
        assert view.shape == (2, d.num_blocks, d.block_size, d.kv_heads, d.head_dim)
        assert view.stride[:2] == (page, 2 * page), view  # blocks outside K/V: its contract's are (B * page, page)
        assert v.kv.layer.manager_block_size == d.block_size and v.kv.layer.kv_cache_layout == t.layout


def test_a_views_cache_is_poisoned_outside_the_written_tokens_and_refuses_other_strides(session):
    t = next(t for t in in_models(session) if t.release.release == "0.22.1")
    v = next(v for v in t.views if v.kv.dims.num_blocks == 2 and v.kv.dims.kv_heads == 2)
    d, c = v.kv.dims, v.kv.contract
    pages = paging((d.block_size + 1,), d.block_size, d.num_blocks, "reversed")
    rows = torch.ones(d.block_size + 1, d.kv_heads, d.head_dim, dtype=torch.float16)
    kv_cache = filled(c, d, pages, rows, 2 * rows, v.within)
    memory = kv_cache.untyped_storage()
    assert memory.nbytes() == v.within.nbytes  # the whole allocation, which the Mamba layer's pages share
    everything = torch.empty(0, dtype=torch.float16).set_(memory)
    written = 2 * (d.block_size + 1) * d.kv_heads * d.head_dim
    assert int((everything == 1).sum() + (everything == 2).sum()) == written
    assert int(everything.isnan().sum()) == everything.numel() - written
    with pytest.raises(ContractError, match="expected the model's view"):
        views.split(c, views.allocate(c, d, torch.float16), d, v.within)  # the contract's own strides


@pytest.mark.parametrize("check", [checks.SPLIT_AGREES, checks.REJECTS_MALFORMED, checks.BIT_IDENTITY,
                                   checks.DETERMINISM], ids=lambda c: c.name)
def test_the_built_in_kernel_is_judged_on_a_hybrid_view_not_refused(session, check, tmp_path):
    runs = loop.Loop(session, "test")
    t = next(t for t in in_models(session) if t.release.release == "0.22.1")
    for ex, extra in in_model.explicit(t.views, CPU):
        runs.replay(Regression(t, ex, extra, ex.digest()), check)  # a refusal or a finding raises NewFinding
    lines = [line for line in (session.results_dir / "0.22.1").glob("*.jsonl") for line in line.read_text().split("\n")
             if t.geometry in line and f'"check": "{check.name}"' in line]
    assert lines and not any('"unsupported"' in line or '"not-run"' in line for line in lines)


def _caught(s, target, examples) -> list[bool]:
    runs = loop.Loop(s, "test")
    out = []
    for ex, extra in examples:
        try:
            runs.replay(Regression(target, ex, extra, ex.digest()), checks.BIT_IDENTITY)
            out.append(False)
        except loop.NewFinding:
            out.append(True)
    return out


def _strided(t) -> bool:
    return t.release.release in HYBRID_RELEASES  # the views whose strides no contract has (the test above)


def test_the_declared_strides_kernel_is_caught_exactly_on_the_views_whose_strides_no_contract_has(session):
    s = _with(session, DeclaredStrides)
    on_views = {t.id: _caught(s, t, in_model.explicit(t.views, CPU)) for t in in_models(s)}
    assert all(all(c) == _strided(t) and any(c) == _strided(t) for t in in_models(s) for c in [on_views[t.id]])
    on_views = {k: c for k, c in on_views.items() if any(c)}
    # Its contracts' own caches, in the releases of those views, at the ambiguous sizes: read right.
    contract_targets = [t for t in geometries(s, kernels=True) if t.release.release in HYBRID_RELEASES
                        and not s.supports(t.release, t.contract, explicit(t.contract, CPU)[0][0].dims)]
    assert contract_targets
    wrong = [t.id for t in contract_targets if any(_caught(s, t, explicit(t.contract, CPU)[:1]))]
    assert not wrong, wrong
    print(f"DeclaredStrides bit-identity: caught on {sum(map(len, on_views.values()))} examples of "
          f"{len(on_views)} model views ({', '.join(on_views)}); on none of the layers at an offset alone; on 0 of "
          f"{len(contract_targets)} contract geometries")


def test_its_twin_reading_the_tensors_strides_passes_on_every_view(session):
    s = _with(session, TensorStrides)
    for t in in_models(s):
        assert not any(_caught(s, t, in_model.explicit(t.views, CPU))), t.id


class ViewMover:
    """Moves blocks through the layer's own K and V views (the built-in split)."""

    name = "view-mover"
    capabilities = frozenset({"split", "transfer"})

    def split(self, kv_cache, layer):
        return kv_views(kv_cache, layer)

    def extract(self, kv_cache, layer, block_ids):
        return tuple(x[block_ids].clone() for x in self.split(kv_cache, layer))

    def inject(self, kv_cache, layer, block_ids, payload):
        for x, data in zip(self.split(kv_cache, layer), payload):
            x[block_ids] = data


class DeclaredMover(ViewMover):
    """The same through K and V views strided as the layer's backend declares its cache."""

    name = "declared-mover"

    def split(self, kv_cache, layer):
        c = contract_of(layer)
        stated = views.geometry(c, dims_of(c, kv_cache, layer), layer.dtype)
        start = kv_cache.storage_offset() - stated.kv_cache.offset
        return tuple(kv_cache.as_strided(x.shape, x.stride, start + x.offset) for x in (stated.k, stated.v))


@pytest.mark.parametrize("mover", [ViewMover, DeclaredMover], ids=lambda m: m.name)
def test_a_transfer_through_a_views_strides_moves_exactly_and_one_through_declared_strides_is_caught(
        session, mover):
    s = dataclasses.replace(_with(session, mover), capabilities=mover.capabilities)
    runs = loop.Loop(s, "test")
    for t in in_models(s):
        caught = mover is DeclaredMover and _strided(t)
        for ex, _ in in_model.explicit(t.views, CPU):
            try:
                runs.replay(Regression(t, ex, 0, ex.digest()), checks.TRANSFER)
                assert not caught, t.id
            except loop.NewFinding as e:
                assert caught, (t.id, str(e)[:300])


def test_a_drawn_batch_fits_the_views_blocks():
    assert in_model.fitting((5, 1, 130), (5, 70, 130), 64, 2) == ((5,), (5,))
    assert in_model.fitting((5, 1), (5, 70), 64, 3) == ((5, 1), (5, 70))
    assert in_model.fitting((130,), (130,), 64, 2) == ((128,), (128,))  # a prefill stays one
    assert in_model.fitting((1,), (300,), 64, 2) == ((1,), (128,))
    assert in_model.fitting((200,), (300,), 64, 2) == ((127,), (128,))  # a chunked prefill keeps fewer queries
    assert math.prod(in_model.fitting((9,), (9,), 16, 1)[1]) == 9


def test_every_in_model_target_names_its_model_and_layer(session):
    for t in in_models(session):
        assert isinstance(t, InModel) and t.id == f"{t.release.release}-model:{t.model}/{t.layer}"


def test_modelopt_splits_the_hybrid_views_and_its_known_refusal_meets_the_layers_at_an_offset(tmp_path):
    pytest.importorskip("modelopt.torch", reason="nvidia-modelopt is not installed (`pip install -e .[modelopt]`)")
    s = sessions.start(NAMED["modelopt"], ["0.22.1", "0.33.0"], store.ROOT, tmp_path / "results",
                       tmp_path / "regressions", findings.DIRECTORY, "cpu", "test", "")
    runs = loop.Loop(s, "test")
    for t in in_models(s):
        ex, extra = in_model.explicit(t.views, CPU)[0]
        runs.replay(Regression(t, ex, extra, ex.digest()), checks.SPLIT_AGREES)  # a new finding raises
    said = {(x.release, x.geometry): (x.outcome, x.known)
            for x in results.read(tmp_path / "results", files="results.*.jsonl") if x.geometry.startswith("model:")}
    assert said[("0.22.1", "model:hybrid/layers.0")] == ("bit-identical", "")
    offset = {g: v for (r, g), v in said.items() if r == "0.33.0"}
    assert len(offset) == len(BESIDE_THE_FIRST) and all(v == ("contract-error", "modelopt#16") for v in offset.values())
