"""The recorded vLLM API in replay (no vLLM installed): every recording's stand-ins reproduce every answer the
release gave, have exactly the recorded members (a method the release lacks is missing, an argument it lacks is a
TypeError), are importable as scoped `vllm` modules one release at a time, and a planted wrong answer is drift."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import inspect
import json
import sys

import pytest

from harness.backends import LAYOUT_ENV, LAYOUT_VALUES
from harness.contract import ContractError
from harness.recordings import store
from harness.recordings.drift import drift
from harness.vllm_api import ApiError, CannotAnswer, ReplayError, api_of, backend_class, replaying, stand_ins
from harness.vllm_api.standins import parse_signature
from harness.vllm_api.surface import encode, surface_diff

if importlib.util.find_spec("vllm") is not None:
    pytest.skip("a real vLLM is installed: these are replay tests", allow_module_level=True)

RECORDED = [r for r in store.releases() if store.load(r).api is not None]
OLD = [r for r in store.releases() if store.load(r).api is None]


def _said(fn):
    try:
        return ("answers", encode(fn()))
    except CannotAnswer as e:
        return ("cannot answer", str(e))
    except Exception as e:  # noqa: BLE001 - the type is the answer
        return ("raises", type(e).__name__)


def _recorded(a):
    return ("raises", a["raises"][0]) if "raises" in a else ("answers", a["result"])


def _under(monkeypatch, cls, a):
    env = a.get("env", "unset")
    if env is None:
        monkeypatch.delenv(LAYOUT_ENV, raising=False)
    elif env != "unset":
        monkeypatch.setenv(LAYOUT_ENV, env)
    for k, v in (a.get("state") or {}).items():
        monkeypatch.setattr(cls, k, v)


def test_the_recordings_hold_the_api() -> None:
    assert RECORDED, "no recording holds the layout API"
    assert not OLD, f"recordings without the layout API (re-record with `nox -s probe -- <release>`): {OLD}"


@pytest.mark.parametrize("release", RECORDED)
def test_stand_ins_reproduce_every_recorded_answer(release: str, monkeypatch) -> None:
    rec = store.load(release)
    api = api_of(rec)
    asked = 0
    for name, b in api.backends.items():
        for a in b.answers:
            devices = {a["device"]} if "device" in a else {None}
            for device in devices:
                cls = stand_ins(rec, device).backend(name)
                with monkeypatch.context() as mp:
                    _under(mp, cls, a)
                    got = _said(lambda: getattr(cls, a["call"])(*a["args"], **a["kwargs"]))
                assert got == _recorded(a), (name, a)
                asked += 1
    s = stand_ins(rec)
    for path, body in api.modules.items():
        for a in (body or {}).get("answers", []):
            with monkeypatch.context() as mp:
                _under(mp, None, a)
                assert _said(lambda: s.function(path, a["call"])(*a["args"])) == _recorded(a), (path, a)
            asked += 1
    assert asked


@pytest.mark.parametrize("release", RECORDED)
def test_stand_ins_have_exactly_the_recorded_members_and_signatures(release: str) -> None:
    api = api_of(store.load(release))
    for name, b in api.backends.items():
        cls = backend_class(release, name)
        assert cls.__name__ == b.cls and cls.__module__ == b.module
        assert {n for n in vars(cls) if not n.startswith("__")} == set(b.members)
        for m in b.members.values():
            if m.signature is not None:
                assert str(inspect.signature(getattr(cls, m.name))) == m.signature, (name, m.name)
        for n, args in (("get_kv_cache_shape", (3, 16, 4, 32)), ("get_kv_cache_stride_order", ())):
            if n in b.members:
                with pytest.raises(TypeError, match="no_such_argument"):
                    getattr(cls, n)(*args, no_such_argument=1)


def test_flash_attention_loses_get_kv_cache_shape_where_the_release_did() -> None:
    had = {r: "get_kv_cache_shape" in api_of(store.load(r)).backend("FLASH_ATTN").members for r in RECORDED}
    for r, has in had.items():
        assert hasattr(backend_class(r, "FLASH_ATTN"), "get_kv_cache_shape") == has
    era = {r: store.load(r).observations.get("era") for r in RECORDED}
    assert all(has == (era[r] != "era_enum") for r, has in had.items()), had


def test_shapes_are_computed_for_sizes_no_recording_used() -> None:
    rec = next(store.load(r) for r in RECORDED if r == "0.25.1") if "0.25.1" in RECORDED else None
    if rec is None:
        pytest.skip("0.25.1 is not re-recorded")
    fa = backend_class(rec, "FLASH_ATTN")
    assert fa.get_kv_cache_shape(9999, 528, 13, 77) == (9999, 2, 528, 13, 77)
    with pytest.raises(ValueError, match="REPLAY of vLLM 0.25.1: Block size must be a multiple of 16"):
        fa.get_kv_cache_shape(3, 17, 4, 32)
    fi = backend_class(rec, "FLASHINFER")
    assert fi.get_kv_cache_shape(5, 16, 3, 80, cache_dtype_str="nvfp4") == (5, 2, 16, 3, 80 // 2 + 80 // 16)
    with pytest.raises(CannotAnswer, match="was not recorded for cache_dtype_str='never_asked'"):
        fa.get_kv_cache_shape(3, 16, 4, 32, cache_dtype_str="never_asked")


def test_a_planted_wrong_answer_is_drift() -> None:
    rec = store.load(RECORDED[-1])
    wrong = copy.deepcopy(rec.api)
    b = next(b for b in wrong["backends"].values() if b.get("answers"))
    a = next(a for a in b["answers"] if "result" in a)
    a["result"] = {"tuple": [1, 2, 3]} if a["result"] != {"tuple": [1, 2, 3]} else "other"
    diff = drift(dataclasses.replace(rec, api=wrong), rec)
    assert any(line.startswith("layout API: ") and a["call"] in line for line in diff), diff
    assert drift(rec, rec) == []
    gone = copy.deepcopy(rec.api)
    first = next(iter(gone["backends"].values()))
    first.get("members", {}).pop(next(iter(first.get("members", {"x": 0}))), None)
    assert surface_diff(gone, rec.api)


def test_an_old_recording_has_no_stand_ins_and_says_how_to_re_record(tmp_path) -> None:
    rec = store.load(RECORDED[0])
    old = dataclasses.replace(rec, api=None)
    with pytest.raises(ApiError, match=rf"records no layout API.*nox -s probe -- {rec.release}"):
        api_of(old)
    store.save(old, tmp_path)
    assert "api" not in json.loads(store.path(rec.release, tmp_path).read_text())
    assert store.load(rec.release, tmp_path).contracts == rec.contracts  # the contracts still replay


def test_module_paths_serve_one_release_at_a_time_and_leave_nothing_behind() -> None:
    a, b = store.load(RECORDED[0]), store.load(RECORDED[-1])
    with replaying(a):
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl

        assert FlashAttentionBackend is backend_class(a, "FLASH_ATTN") or FlashAttentionBackend.__doc__.startswith(
            f"REPLAY stand-in for vLLM {a.release}")

        class Sub(FlashAttentionImpl):  # a consumer subclasses it at import time, as modelopt's plugin does
            pass

        with pytest.raises(ReplayError, match="placeholder"):
            FlashAttentionImpl()
        with pytest.raises(ReplayError, match="forward"):
            object.__new__(Sub).forward()
        with pytest.raises(ModuleNotFoundError, match=f"REPLAY of vLLM {a.release} has no stand-in for vllm.engine"):
            import vllm.engine  # noqa: F401
        if a.release != b.release:
            with pytest.raises(RuntimeError, match="one release at a time"):
                with replaying(b):
                    pass
    assert not [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]


def test_rebind_points_an_imported_module_at_the_replayed_release() -> None:
    import types

    a, b = store.load(RECORDED[0]), store.load(RECORDED[-1])
    consumer = types.ModuleType("consumer")
    with replaying(a):
        exec("from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend", vars(consumer))
    first = consumer.FlashAttentionBackend
    with replaying(b, rebind=(consumer,)):
        assert consumer.FlashAttentionBackend.__doc__.startswith(f"REPLAY stand-in for vLLM {b.release}")
        exec("def ask():\n    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend as F\n"
             "    return F", vars(consumer))
        assert consumer.ask() is consumer.FlashAttentionBackend  # imported inside a call: the same release
    assert consumer.FlashAttentionBackend is first


def test_replay_refuses_beside_real_vllm_modules(monkeypatch) -> None:
    import types

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    with pytest.raises(RuntimeError, match="already imported"):
        with replaying(store.load(RECORDED[0])):
            pass


def test_a_recorded_signature_that_does_not_parse_is_named() -> None:
    with pytest.raises(ApiError, match="X.y: recorded signature"):
        parse_signature("(a, b=", "X.y")
    assert str(parse_signature("(x: 'torch.Tensor', n: int = 3) -> tuple[int, ...]", "x")) == \
        "(x: 'torch.Tensor', n: int = 3) -> tuple[int, ...]"


def test_a_backend_the_release_lacks_is_named() -> None:
    rec = store.load(RECORDED[0])
    absent = api_of(rec).absent
    if not absent:
        pytest.skip(f"vLLM {rec.release} has every backend")
    name = next(iter(absent))
    with pytest.raises(ApiError, match=name):
        backend_class(rec, name)


def test_modelopt_release_without_api_is_a_contract_error() -> None:
    from kvconform.subjects.modelopt import VllmRelease

    with pytest.raises(ContractError, match="records no layout API"):
        VllmRelease.from_recording(dataclasses.replace(store.load(RECORDED[0]), api=None))


@pytest.mark.parametrize("release", RECORDED)
def test_stride_orders_agree_with_the_contracts(release: str, monkeypatch) -> None:
    # The stand-in's stride order (a recorded answer) and the contract the probe read under the same setting (the
    # model the conformance suites allocate from) must name the same physical order.
    rec = store.load(release)
    checked = 0
    for c in rec.contracts:
        try:
            cls = backend_class(rec, c.origin.backend_name)
        except ApiError:
            continue
        if not hasattr(cls, "get_kv_cache_stride_order"):
            continue
        for setting in c.origin.setting.split(" + "):
            value = setting.split()[0].removeprefix(f"{LAYOUT_ENV}=")
            if value not in LAYOUT_VALUES:
                continue
            monkeypatch.setenv(LAYOUT_ENV, value)
            if "cross-layer" in setting:
                want = tuple((("L",) + c.layout.logical).index(a) for a in c.layout.physical)
                assert cls.get_kv_cache_stride_order(include_num_layers_dimension=True) == want, (c.describe(), setting)
            else:
                want = tuple(c.layout.logical.index(a) for a in c.layout.physical)
                assert cls.get_kv_cache_stride_order() == want, (c.describe(), setting)
            checked += 1
    era = rec.observations.get("era")
    assert checked or era in ("era_enum", "era_shape"), f"vLLM {release}: no contract was checked"


def test_a_planted_wrong_shape_answer_leaves_the_model_without_an_answer() -> None:
    # The shape is computed from the contract and a width rule; an answer no rule reproduces is refused, not served.
    rec = next((store.load(r) for r in RECORDED if store.load(r).observations.get("era") != "era_enum"), None)
    api = copy.deepcopy(rec.api)
    fa = api["backends"]["FLASH_ATTN"]
    a = next(a for a in fa["answers"] if a["call"] == "get_kv_cache_shape" and "result" in a)
    a["result"] = {"tuple": [v + 1 for v in a["result"]["tuple"]]}
    planted = dataclasses.replace(rec, api=api)
    from harness.vllm_api.standins import StandIns

    cls = StandIns(api_of(planted), planted.contracts).backend("FLASH_ATTN")
    with pytest.raises(CannotAnswer, match="no layout model reproduces"):
        cls.get_kv_cache_shape(*a["args"], **a["kwargs"])
    assert _said(lambda: cls.get_kv_cache_shape(*a["args"], **a["kwargs"]))[0] != _recorded(a)[0]


def test_recordings_that_build_the_same_stand_ins_share_them_and_others_do_not() -> None:
    from harness.vllm_api import modules

    rec = store.load("0.25.1")
    again = dataclasses.replace(rec)  # equal, with the same API, not the same object
    other = dataclasses.replace(rec, contracts=rec.contracts[:-1])
    assert again is not rec and again == rec
    assert stand_ins(again) is stand_ins(rec) and modules.build(again) is modules.build(rec)
    assert stand_ins(other) is not stand_ins(rec) and modules.build(other) is not modules.build(rec)
