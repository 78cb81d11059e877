"""Recorded contracts: JSON round trip, the drift alarm's messages, the table, and the committed fixtures."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from harness import matrix
from harness.contract import Contract, ContractError, Dims, views
from harness.recordings import store
from harness.recordings.drift import drift
from harness.recordings.store import Recording

NHD = Contract.of(("KV", "B", "N", "H", "D"), ("KV", "B", "N", "H", "D"), "vllm 0.20.2 FLASH_ATTN NHD")
HND = Contract.of(("KV", "B", "N", "H", "D"), ("KV", "B", "H", "N", "D"), "vllm 0.20.2 FLASH_ATTN HND")


def _rec(*contracts: Contract, release: str = "0.20.2") -> Recording:
    return Recording(release, contracts, {"method": "fake", "settings": {"NHD": {"stride_order": [0, 1, 2, 3, 4]}}})


def test_round_trip_keeps_contracts_origins_and_observations(tmp_path):
    rec = _rec(NHD, HND)
    store.save(rec, tmp_path)
    back = store.load("0.20.2", tmp_path)
    assert back == rec
    assert [c.origin for c in back.contracts] == [NHD.origin, HND.origin]
    assert back.observations == rec.observations
    assert store.releases(tmp_path) == ["0.20.2"]


def test_load_of_an_unrecorded_release_names_it(tmp_path):
    with pytest.raises(ContractError, match=r"no recorded contracts for vllm 0\.99\.0 .*nox -s probe -- 0\.99\.0"):
        store.load("0.99.0", tmp_path)


def test_load_rejects_a_file_recording_another_release(tmp_path):
    store.save(_rec(NHD), tmp_path)
    (tmp_path / "0.21.0.json").write_text((tmp_path / "0.20.2.json").read_text())
    with pytest.raises(store.BadRecording, match="records release '0.20.2', not '0.21.0'"):
        store.load("0.21.0", tmp_path)


def test_a_truncated_recording_names_its_file_and_line(tmp_path):
    store.save(_rec(NHD), tmp_path)
    p = tmp_path / "0.20.2.json"
    p.write_text(p.read_text()[:200])
    with pytest.raises(store.BadRecording, match=rf"^{re.escape(str(p))}:\d+:\d+: not a recording: invalid JSON"):
        store.load("0.20.2", tmp_path)


def test_a_recording_of_an_unknown_layout_names_its_file(tmp_path):
    store.save(_rec(NHD), tmp_path)
    p = tmp_path / "0.20.2.json"
    p.write_text(p.read_text().replace('"KV"', '"QQ"'))
    with pytest.raises(store.BadRecording, match=rf"^{re.escape(str(p))}: not a recording: "):
        store.load("0.20.2", tmp_path)


def test_no_drift_between_a_recording_and_itself():
    assert drift(_rec(NHD, HND), _rec(NHD, HND)) == []


def test_no_drift_for_a_nightly_with_the_same_contracts():
    live = [Contract.of(c.layout.logical, c.layout.physical, dataclasses.replace(c.origin, release="0.34.0.dev1"))
            for c in (NHD, HND)]
    assert drift(_rec(NHD, HND, release="main"), _rec(*live, release="0.34.0.dev1")) == []


def test_drift_names_a_changed_stride_order():
    moved = Contract.of(HND.layout.logical, ("KV", "B", "N", "H", "D"), HND.origin)
    assert drift(_rec(NHD, HND), _rec(NHD, moved)) == [
        "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=HND: physical (stride) order KV.B.H.N.D -> KV.B.N.H.D"
    ]


def test_drift_names_a_moved_axis():
    blocks_first = Contract.of(("B", "KV", "N", "H", "D"), ("B", "KV", "N", "H", "D"), NHD.origin)
    assert drift(_rec(NHD), _rec(blocks_first)) == [
        "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD: logical axes [KV,B,N,H,D] (kv-first) -> [B,KV,N,H,D] (blocks-first)",
        "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD: axes moved: KV 0->1, B 1->0",
        "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD: physical (stride) order KV.B.N.H.D -> B.KV.N.H.D",
    ]


def test_drift_names_a_changed_split():
    packed = Contract.of(("B", "H", "N", "C"), ("B", "N", "H", "C"), NHD.origin)
    lines = drift(_rec(NHD), _rec(packed))
    assert "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD: K/V split unbind KV (K=0, V=1) -> halves of C (K=C[:D], V=C[D:])" in lines


def test_drift_names_appeared_and_gone_settings():
    cross = Contract.of(NHD.layout.logical, ("B", "L", "KV", "N", "H", "D"), "vllm 0.20.2 FLASH_ATTN NHD cross-layer")
    lines = drift(_rec(NHD, HND), _rec(NHD, cross))
    assert lines == [
        "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=HND: contract gone (was " + HND.describe() + ")",
        "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD cross-layer: new contract " + cross.describe(),
    ]


def test_a_recording_in_an_older_spelling_does_not_drift_from_the_probe_today():
    # Recordings made before every backend was read by one reader named FLASH_ATTN's settings by the layout value
    # alone, and releases before 0.11 the backend FLASH_ATTN_VLLM_V1; the probe spells both as for every backend.
    old = [Contract.of(NHD.layout.logical, NHD.layout.physical, "vllm 0.10.2 FLASH_ATTN_VLLM_V1 NHD"),
           Contract.of(NHD.layout.logical, ("B", "L", "KV", "N", "H", "D"), "vllm 0.10.2 FLASH_ATTN NHD cross-layer")]
    new = [Contract.of(NHD.layout.logical, NHD.layout.physical, "vllm 0.10.2 FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD"),
           Contract.of(NHD.layout.logical, ("B", "L", "KV", "N", "H", "D"),
                       "vllm 0.10.2 FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD cross-layer")]
    assert drift(_rec(*old, release="0.10.2"), _rec(*new, release="0.10.2")) == []
    moved = Contract.of(NHD.layout.logical, ("B", "L", "KV", "H", "N", "D"), new[1].origin)
    assert drift(_rec(*old, release="0.10.2"), _rec(new[0], moved, release="0.10.2")) == [
        "FLASH_ATTN VLLM_KV_CACHE_LAYOUT=NHD cross-layer: physical (stride) order B.L.KV.N.H.D -> B.L.KV.H.N.D"]


def test_table_has_one_row_per_release_backend_dtype_and_family(tmp_path):
    store.save(_rec(NHD, HND), tmp_path)
    packed = Contract.of(("B", "H", "N", "C"), ("B", "N", "H", "C"), "vllm 0.26.0 FLASH_ATTN NHD")
    nvfp4 = Contract.of(("B", "S", "N", "D"), ("B", "S", "N", "D"), "vllm 0.26.0 FLASHINFER NHD", "nvfp4")
    store.save(Recording("0.26.0", (packed, nvfp4), {"method": "m"}), tmp_path)
    store.save(Recording("0.27.1", (packed, nvfp4), {"method": "m"}), tmp_path)
    rows = store.table(tmp_path).splitlines()
    assert rows[2].startswith("| 0.20.2 | FLASH_ATTN | auto | kv-first | (KV,B,N,H,D) | KV.B.N.H.D KV.B.H.N.D | unbind KV")
    assert rows[3].startswith("| 0.26.0 | FLASH_ATTN | auto | packed | (B,H,N,C) | B.N.H.C | halves of C")
    assert rows[4].startswith("| 0.26.0 | FLASHINFER | nvfp4 | head-slots | (B,S,N,D) | B.S.N.D | halves of S")
    assert [r.rsplit("|", 2)[1].strip() for r in rows[2:]] == ["new", "**changed**", "new", "same", "same"]
    assert len(rows) == 7
    grid = store.matrix(tmp_path).splitlines()
    assert grid[0] == "| releases | FLASH_ATTN<br>auto | FLASHINFER<br>nvfp4 |"
    assert grid[2:] == ["| 0.20.2 | kv-first ×2 | — |", "| 0.26.0 – 0.27.1 | packed ×1 | head-slots ×1 |"]


# The committed fixtures themselves.

RECORDED = store.releases()


def test_every_matrix_release_has_a_recording():
    assert set(RECORDED) == {r.name for r in matrix.load()}


@pytest.mark.parametrize("release", RECORDED)
def test_recording_matches_its_matrix_entry_and_instantiates(release):
    rec = store.load(release)
    assert rec.contracts, release
    assert rec.observations["era"] == matrix.get(release).era
    for c in rec.contracts:
        dims = Dims(num_blocks=3, block_size=16, kv_heads=1 if c.layout.latent else 4, head_dim=32, num_layers=5,
                    layer=2, head_dim_v=24 if c.diff_kv else 0)
        named = views.canonical(c, views.allocate(c, dims, torch.float32), dims)
        widths = {"K": c.dtype.width(32), "V": c.dtype.width(24 if c.diff_kv else 32), "latent": 32}
        assert {n: tuple(t.shape) for n, t in named.items()} == {
            n: ((3, 16, 32) if n == "latent" else (3, 16, 4, widths[n])) for n in named}, c.describe()
    # every FLASH_ATTN model-dtype contract was read with an observed write (and every other backend's where its
    # release has do_kv_cache_update) that put K and V where its split says, and nowhere else
    writes = list(_writes(rec.observations))
    assert len(writes) >= sum(1 for c in rec.contracts if c.origin.backend_name == "FLASH_ATTN" and c.cache_dtype == "auto")
    assert all((w["K"], w["V"]) in (("KV=0", "KV=1"), ("C[0:32]", "C[32:64]")) and w["stray_cells"] == 0
               and w["tokens"] == 5 for w in writes)


def _writes(obs):
    if isinstance(obs, dict):
        if "stray_cells" in obs:
            yield obs
        for v in obs.values():
            yield from _writes(v)


def test_main_recording_says_where_it_came_from():
    obs = store.load("main").observations
    assert obs["copied_from"] == RECORDED[-2] and "nightly index" in obs["note"]


def test_drift_names_the_backend_and_cache_dtype_that_moved():
    fi = Contract.of(("B", "S", "N", "D"), ("B", "S", "N", "D"), "vllm 0.33.0 FLASHINFER LBHNC single-layer", "nvfp4")
    moved = Contract.of(("B", "S", "N", "D"), ("B", "N", "S", "D"), "vllm 0.33.0 FLASHINFER LBHNC single-layer",
                        "nvfp4")
    fa = Contract.of(("B", "H", "N", "C"), ("B", "H", "N", "C"), "vllm 0.33.0 FLASH_ATTN LBHNC single-layer")
    assert drift(Recording("0.33.0", (fa, fi)), Recording("0.33.0", (fa, fi))) == []
    assert drift(Recording("0.33.0", (fa, fi)), Recording("0.33.0", (fa, moved))) == [
        "FLASHINFER nvfp4 LBHNC single-layer: physical (stride) order B.S.N.D -> B.N.S.D"]
    assert drift(Recording("0.33.0", (fa, fi)), Recording("0.33.0", (fa,))) == [
        f"FLASHINFER nvfp4 LBHNC single-layer: contract gone (was {fi.describe()})"]


FI_NHD = Contract.of(("B", "KV", "N", "H", "D"), ("B", "KV", "N", "H", "D"),
                     "vllm 0.26.0 FLASHINFER VLLM_KV_CACHE_LAYOUT=NHD")
FI_HND = Contract.of(("B", "KV", "N", "H", "D"), ("B", "KV", "H", "N", "D"),
                     "vllm 0.26.0 FLASHINFER VLLM_KV_CACHE_LAYOUT=HND")
FA_NHD = Contract.of(("KV", "B", "N", "H", "D"), ("KV", "B", "N", "H", "D"), "vllm 0.26.0 FLASH_ATTN NHD")
FI_READ = {"present": True, "read": True, "class": "vllm.v1.attention.backends.flashinfer.FlashInferBackend"}
FI_UNIMPORTABLE = {"present": True, "read": False, "why": "not importable: importing "
                   "vllm.v1.attention.backends.flashinfer raised ModuleNotFoundError: No module named 'flashinfer_dep'"}
FI_ABSENT = {"present": False, "why": "no vllm.v1.attention.backends.flashinfer.FlashInferBackend in this release"}


def _seen(contracts: tuple[Contract, ...], **backends: dict) -> Recording:
    return Recording("0.26.0", contracts, {"backends": backends})


def test_a_backend_the_live_probe_could_not_import_is_one_line_with_the_error_not_contract_gone():
    lines = drift(_seen((FA_NHD, FI_NHD, FI_HND), FLASHINFER=FI_READ), _seen((FA_NHD,), FLASHINFER=FI_UNIMPORTABLE))
    assert lines == [f"backend FLASHINFER could not be imported or read: {FI_UNIMPORTABLE['why']}; the recording "
                     "read 2 contracts from it"]
    assert not any("contract gone" in line for line in lines)


def test_a_backend_module_missing_from_the_live_install_is_named_not_contract_gone():
    # A carried subset of the release without the backend's module: the probe sees no such backend.
    assert drift(_seen((FA_NHD, FI_NHD, FI_HND), FLASHINFER=FI_READ), _seen((FA_NHD,), FLASHINFER=FI_ABSENT)) == [
        f"backend FLASHINFER could not be imported or read: {FI_ABSENT['why']}; the recording read 2 contracts from it"]


def test_a_backend_the_recording_could_not_import_either_is_no_drift():
    assert drift(_seen((FA_NHD,), FLASHINFER=FI_UNIMPORTABLE), _seen((FA_NHD,), FLASHINFER=FI_UNIMPORTABLE)) == []
    assert drift(_seen((FA_NHD,), FLASHINFER=FI_ABSENT), _seen((FA_NHD,), FLASHINFER=FI_ABSENT)) == []


def test_a_backend_that_fails_to_import_where_the_recording_had_none_is_named():
    assert drift(_seen((FA_NHD,), FLASHINFER=FI_ABSENT), _seen((FA_NHD,), FLASHINFER=FI_UNIMPORTABLE)) == [
        f"backend FLASHINFER could not be imported or read: {FI_UNIMPORTABLE['why']}"]



def test_a_cache_dtype_a_backend_lists_but_kvconform_does_not_model_is_named():
    rec = store.load("0.25.1")
    listed = rec.observations["backends"]["TRITON_ATTN"]["supported_kv_cache_dtypes"]
    assert {"int8_per_token_head", "fp8_e5m2", "bfloat16"} <= set(listed)
    assert store.unmodelled(rec) == {"int4_per_token_head": ["TRITON_ATTN"], "int8_per_token_head": ["TRITON_ATTN"]}
    planted = dataclasses.replace(rec, observations={"backends": {"X": {"supported_kv_cache_dtypes": ["fp8", "fp6"]}}})
    assert store.unmodelled(planted) == {"fp6": ["X"]}
