"""What a consumer can call, release by release (harness.recordings.api_history): the changes found in the committed
recordings, exactly those of a hand-written pair of `api` fields, none between identical ones or respelled
annotations, and the table committed in docs/releases.md is what the command prints."""

import copy
import json
from pathlib import Path

import pytest

from harness.recordings import api_history, store
from harness.recordings.api_history import GONE, NEW, SIGNATURE, VALUE, ApiChange
from harness.vllm_api import surface

REPO = Path(__file__).resolve().parent.parent
STEPS = {s.release: s for s in api_history.history()}


def test_the_recordings_show_the_layout_calls_that_came_and_went():
    every = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION", "FLASH_ATTN_DIFFKV", "TRITON_MLA")
    gone = STEPS["0.29.0"].changes
    assert STEPS["0.29.0"].before == "0.28.0" and STEPS["0.29.0"].backends == every
    for name in ("get_kv_cache_shape", "get_kv_cache_stride_order"):
        assert ApiChange(GONE, name, every) in gone
    for name in ("get_kv_cache_layout", "set_kv_cache_layout"):
        assert ApiChange(GONE, f"vllm.v1.attention.backends.utils.{name}") in gone
    assert {ApiChange(NEW, "module vllm.v1.kv_cache_layout"), ApiChange(NEW, "vllm.v1.kv_cache_layout.KVCacheLayout"),
            ApiChange(NEW, "supported_kv_cache_layouts", every)} <= set(gone)
    five = tuple(b for b in every if b != "FLASH_ATTN_DIFFKV")  # the diff-KV backend comes in 0.14.1
    assert ApiChange(SIGNATURE, "get_kv_cache_shape", five,
                  "gains cache_dtype_str: str = 'auto'") in STEPS["0.11.2"].changes
    assert ApiChange(SIGNATURE, "get_kv_cache_stride_order", five,
                  "gains include_num_layers_dimension: bool = False") in STEPS["0.12.0"].changes
    assert ApiChange(NEW, "backend FLEX_ATTENTION") in STEPS["0.9.2"].changes
    # 0.9.2 respells get_kv_cache_stride_order's return `Tuple[int, ...]` as `tuple[int, ...]`: the same call.
    assert not [c for c in STEPS["0.9.2"].changes if c.kind == SIGNATURE]
    assert STEPS["0.30.0"].changes == () and STEPS["main"].changes == ()


def _api(members, names, backends=("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")):
    backend = {"present": True, "module": "m", "class": "C", "members": members, "module_names": [], "answers": []}
    return {"format": 1, "modules": {"vllm.v1.attention.backends.utils": {"names": names, "public": [], "answers": []},
                                     "vllm.v1.kv_cache_layout": None},
            "backends": {**{b: copy.deepcopy(backend) for b in backends}, "GONE_ONE": dict(backend),
                         "NEW_ONE": {"present": False}}}


OLD = _api({"get_kv_cache_shape": {"kind": "staticmethod",
                                   "signature": "(num_blocks: int, block_size: int) -> Tuple[int, ...]"},
            "supported_kv_cache_dtypes": {"kind": "value", "value": ["auto", "fp8_e5m2"]},
            "is_mla": {"kind": "classmethod", "signature": "() -> bool"}},
           {"get_kv_cache_layout": {"kind": "function", "signature": "()"},
            "set_kv_cache_layout": {"kind": "function", "signature": "(cache_layout: str)"}})


def _new():
    new = copy.deepcopy(OLD)
    new["modules"]["vllm.v1.attention.backends.utils"]["names"] = {
        "set_kv_cache_layout": {"kind": "function", "signature": "(cache_layout: Optional[Literal['NHD', 'HND']])"}}
    new["modules"]["vllm.v1.attention.backends.utils"]["public"] = ["anything", "else"]  # not layout API
    new["modules"]["vllm.v1.kv_cache_layout"] = {"names": {"KVCacheLayout": {
        "kind": "enum", "members": {"LBHNC": {"tuple": [0, 1, 2, 3, 4]}}, "properties": {}}}, "public": [],
        "answers": []}
    new["backends"]["GONE_ONE"] = {"present": False}
    new["backends"]["NEW_ONE"] = copy.deepcopy(OLD["backends"]["FLASH_ATTN"])
    for b in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"):
        m = new["backends"][b]["members"]
        m["get_kv_cache_shape"]["signature"] = ("(num_blocks: int, block_size: int, cache_dtype_str: str = 'auto')"
                                                " -> 'tuple[int, ...]'")
        m["supported_kv_cache_dtypes"]["value"] = ["auto", "fp8"]
        new["backends"][b]["answers"] = [{"call": "get_kv_cache_shape", "result": 1}]  # answers: not compared
    new["backends"]["FLASHINFER"]["members"]["head_size_v"] = {"kind": "value", "value": None}
    del new["backends"]["TRITON_ATTN"]["members"]["is_mla"]
    return new


def test_a_hand_written_pair_gives_exactly_the_expected_lines(tmp_path):
    for release, body in (("0.1.0", OLD), ("0.2.0", _new())):
        (tmp_path / f"{release}.json").write_text(json.dumps({"release": release, "contracts": [], "api": body}))
    [step] = api_history.history(tmp_path)
    assert (step.release, step.before, step.backends) == ("0.2.0", "0.1.0", ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"))
    assert {k: api_history.said(step, k) for k in api_history.KINDS} == {
        GONE: "vllm.v1.attention.backends.utils.get_kv_cache_layout, backend GONE_ONE, TRITON_ATTN.is_mla",
        NEW: "module vllm.v1.kv_cache_layout, vllm.v1.kv_cache_layout.KVCacheLayout, backend NEW_ONE, "
             "FLASHINFER.head_size_v",
        SIGNATURE: "vllm.v1.attention.backends.utils.set_kv_cache_layout parameter cache_layout: str → "
                   "Literal['NHD', 'HND'] | None; get_kv_cache_shape gains cache_dtype_str: str = 'auto' (all 3 "
                   "backends)",
        VALUE: "supported_kv_cache_dtypes gains fp8 and loses fp8_e5m2 (all 3 backends)",
        api_history.UNREAD: ""}
    table = api_history.table(tmp_path).splitlines()
    assert table[0] == "| release | against | gone | new | signature | value |"
    assert table[2].startswith("| 0.2.0 | 0.1.0 | vllm.v1.attention.backends.utils.get_kv_cache_layout, ")
    assert "Literal['NHD', 'HND'] \\| None<br>get_kv_cache_shape gains" in table[2]  # a table cell escapes its bars


def test_it_reads_the_format_the_probe_records():
    assert api_history.FORMAT == surface.FORMAT


def test_identical_releases_and_respelled_annotations_give_nothing():
    assert api_history.step("0.1.0", "0.2.0", OLD, copy.deepcopy(OLD)).changes == ()
    assert api_history.signature_changes("(x: 'Optional[List[int]]', y: Tuple[int, ...] = (1,)) -> 'Type[A]'",
                                         "(x: list[int] | None, y: 'tuple[int, ...]' = (1,)) -> type['A']") == []
    assert api_history.signature_changes("(x: int, y: int = 1)", "(y: int = 2, *, x: int, z=None)") == [
        "gains keyword-only z = None", "parameter x: positional → keyword-only", "parameter y default: 1 → 2",
        "parameters reordered: (x, y) → (y, x)"]


def test_a_recording_that_is_not_json_is_an_error_naming_it(tmp_path):
    (tmp_path / "0.1.0.json").write_text(json.dumps({"release": "0.1.0", "api": OLD}))
    (tmp_path / "0.2.0.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"0\.2\.0\.json: not a recording: invalid JSON"):
        api_history.history(tmp_path)
    (tmp_path / "0.2.0.json").write_text(json.dumps({"release": "0.2.0", "contracts": []}))  # recorded without it
    assert api_history.history(tmp_path) == []


def test_the_committed_table_is_what_the_command_prints(capsys):
    assert store.main(["api-changes"]) == 0
    printed = capsys.readouterr().out
    assert printed == api_history.table() + "\n"
    doc = (REPO / "docs" / "releases.md").read_text()
    section = doc.split("\n## What a consumer can call, release by release\n", 1)[1].split("\n## ", 1)[0]
    assert printed.strip() in section, "docs/releases.md: paste `python -m harness.recordings.store api-changes` again"
