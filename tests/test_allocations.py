"""The whole-model allocations the probe recorded (harness.probe.allocation) as read back by
harness.recordings.allocations: each recording holds together, a change at this level is drift, and docs/releases.md
shows what the command prints. No vLLM needed: the recordings are the release's answers."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from harness.probe.models import MODELS
from harness.recordings import allocations, store
from harness.recordings.drift import drift

REPO = Path(__file__).resolve().parents[1]
RECS = allocations.recordings()
READ = [(name, allocations.read(rec)) for name, rec in RECS if allocations.read(rec) is not None]
NEWEST = "0.33.0"


def _models():
    for name, found in READ:
        for model, record in found["models"].items():
            if "layers" in record:
                yield pytest.param(name, model, record, id=f"{name}-{model}")


def test_the_releases_from_the_planners_groups_on_are_read_and_the_others_say_why():
    names = [name for name, _ in READ]
    assert {"0.12.0", "0.28.0", "0.29.0", NEWEST} <= set(names), names
    assert dict(READ)["0.28.0"]["allocator"].endswith("GPUModelRunner.initialize_kv_cache_tensors")
    assert dict(READ)["0.29.0"]["allocator"].endswith("worker.utils.allocate_kv_cache")
    for name, rec in RECS:
        found = rec["observations"].get("allocations")
        assert found is not None, f"{name}: re-record it (python -m harness.probe)"
        if not found["read"]:
            assert "get_kv_cache_groups" in found["why"], (name, found["why"])


@pytest.mark.parametrize(("release", "model", "record"), list(_models()))
def test_every_allocated_layer_lies_in_its_allocation_and_overlaps_only_where_recorded(release, model, record):
    layers = record["layers"]
    assert set(layers) == set(next(m for m in MODELS if m.name == model).layers), "a layer of the model is missing"
    for name, layer in layers.items():
        for view in allocations.views(layer):
            lo, hi = view["span"]
            assert 0 <= lo < hi <= record["allocations"][view["allocation"]], (name, view)
        rule = allocations.kernel_rule(layer["kernel_blocks"])
        assert not rule.startswith("irregular"), (name, rule)
        for other in layer["overlaps"]:
            assert name in layers[other]["overlaps"], f"{name} overlaps {other} but not the other way round"
            if layer["group"] == layers[other]["group"]:
                assert (layer["shares"] or name) == (layers[other]["shares"] or other), \
                    f"{name} and {other} share bytes inside one group without one reusing the other's cache"
        if layer["shares"]:
            assert layer["shares"] in layer["overlaps"], f"{name} reuses {layer['shares']}'s cache but not its bytes"


def test_kernel_rule_reads_a_regular_split_and_names_an_irregular_one():
    assert allocations.kernel_rule([[0], [1], [2]]) == "k = m"
    assert allocations.kernel_rule([[0, 1], [2, 3]]) == "k = m*2 + j, j < 2"
    assert allocations.kernel_rule([[0, 1], [3, 2]]).startswith("irregular: ")
    assert allocations.kernel_rule([[0], []]).startswith("irregular: ")


def test_the_cell_says_each_thing_a_consumer_must_know():
    found = dict(READ)[NEWEST]["models"]
    assert "kernel blocks of 64 in manager blocks of 256" in allocations.cell(found["kernel-split"])
    assert "groups overlaid" in allocations.cell(found["sliding"])
    assert "padded pages" in allocations.cell(found["hybrid"])
    assert "shared layers" in allocations.cell(found["shared"])
    assert "layers interleaved per block" in allocations.cell(found["cross-layer-fp8"])
    assert allocations.cell(found["padded-split"]).startswith("refused at ")
    assert allocations.cell(found["uniform"]) == "LBNHC, 1 group"


def _live(change) -> store.Recording:
    rec = store.load(NEWEST)
    obs = copy.deepcopy(rec.observations)
    change(obs["allocations"])
    return dataclasses.replace(rec, observations=obs)


def test_a_kernel_block_size_that_moves_is_drift_naming_model_layer_and_values():
    def smaller(a):
        a["models"]["kernel-split"]["layers"]["layers.0"]["kernel_block_size"] = 16
    lines = drift(store.load(NEWEST), _live(smaller))
    assert lines == ["allocation: kernel-split layers.layers.0.kernel_block_size: 64 -> 16"]


def test_a_model_the_release_starts_refusing_is_drift():
    def refuse(a):
        a["models"]["hybrid"] = {"about": a["models"]["hybrid"]["about"],
                                 "refused": {"step": "get_kv_cache_groups", "error": "ValueError: no"}}
    lines = drift(store.load(NEWEST), _live(refuse))
    assert lines == ["allocation: hybrid: LBNHC, 2 groups, groups overlaid, padded pages -> refused at "
                     "get_kv_cache_groups: ValueError: no"]


def test_a_connector_handed_another_view_than_the_layer_is_drift():
    def other(a):
        a["models"]["kernel-split"]["layers"]["layers.1"]["connector"] = {"shape": [4, 2, 256, 64]}
    lines = drift(store.load(NEWEST), _live(other))
    assert lines == ["allocation: kernel-split layers.layers.1.connector: the layer's tensor -> "
                     "{'shape': [4, 2, 256, 64]}"]


def test_another_allocating_function_is_drift():
    def runner(a):
        a["allocator"] = "vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache_tensors"
    assert drift(store.load(NEWEST), _live(runner)) == [
        "allocation: allocator vllm.v1.worker.utils.allocate_kv_cache -> "
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache_tensors"]


def test_a_recording_without_allocations_drifts_until_re_recorded():
    rec = store.load(NEWEST)
    bare = dataclasses.replace(rec, observations={k: v for k, v in rec.observations.items() if k != "allocations"})
    assert drift(bare, rec) == ["allocation: whole-model allocations: not recorded -> read"]
    assert drift(rec, rec) == []


def test_docs_releases_shows_what_the_command_prints():
    printed = subprocess.run([sys.executable, "-m", "harness.recordings.store", "allocations"], capture_output=True,
                             text=True, check=True, cwd=REPO).stdout
    doc = (REPO / "docs" / "releases.md").read_text()
    assert printed.strip() in doc, "docs/releases.md: paste `python -m harness.recordings.store allocations` again"
