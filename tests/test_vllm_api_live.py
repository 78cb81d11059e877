"""Live: the installed vLLM release's own backend classes against the stand-ins built from its recording, over
hypothesis-drawn arguments (sizes no recording used, every recorded cache dtype string, the layers flag, every layout
setting). Skipped without vLLM. A stand-in that cannot answer where the release answers is a mismatch; where the
release raises, the stand-in must raise the same exception type. The recorded KV cache config a replayed connector
is handed reads as the release's own, model by model.

    KVCONFORM_LIVE_COUNTS=/tmp/counts.json pytest tests/test_vllm_api_live.py   (in a venv holding vLLM)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
from collections import Counter

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: the live comparison needs a release", allow_module_level=True)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st

from harness.backends import layout_env  # noqa: E402
from harness.probe import api as probe_api  # noqa: E402
from harness.recordings import store  # noqa: E402
from harness.vllm_api import api_of, stand_ins  # noqa: E402
from harness.vllm_api.surface import BACKEND_MEMBERS, FLAGS, describe, describe_enum, encode  # noqa: E402

RELEASE = os.environ.get("KVCONFORM_LIVE_RELEASE") or importlib.metadata.version("vllm")
REC = store.load(RELEASE, store.Path(os.environ["KVCONFORM_CONTRACTS_DIR"])) if os.environ.get(
    "KVCONFORM_CONTRACTS_DIR") else store.load(RELEASE)
API = api_of(REC)
S = stand_ins(REC)
BACKENDS = sorted(API.backends)
EXAMPLES = int(os.environ.get("KVCONFORM_LIVE_EXAMPLES", "300"))
COUNTS: Counter = Counter()
LIVE = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)


_REAL: dict[str, type] = {}


def real(name: str) -> type:
    """vLLM's own class, imported as the probe imports it (a GPU library that does not import here stubbed)."""
    if name not in _REAL:
        b = API.backends[name]
        with probe_api._importing(b.module):
            _REAL[name] = getattr(importlib.import_module(b.module), b.cls)
    return _REAL[name]


def outcome(fn) -> tuple:
    try:
        return ("answers", encode(fn()))
    except Exception as e:  # noqa: BLE001 - the exception type is the release's answer
        return ("raises", type(e).__name__.split(".")[-1])


@pytest.fixture(scope="session", autouse=True)
def _counts():
    yield
    out = os.environ.get("KVCONFORM_LIVE_COUNTS")
    if out:
        with open(out, "w") as f:
            json.dump({"release": RELEASE, "examples": {" ".join(k): v for k, v in sorted(COUNTS.items())}}, f,
                      indent=1)


def _layout(setting):
    return layout_env(setting)


@pytest.mark.parametrize("name", BACKENDS)
def test_surface_is_the_releases(name: str) -> None:
    live, stand = real(name), S.backend(name)
    for n in BACKEND_MEMBERS:
        assert hasattr(live, n) == hasattr(stand, n), n
        if hasattr(live, n):
            assert describe(stand, n) == describe(live, n), n


def test_module_surfaces_are_the_releases() -> None:
    from harness.vllm_api.surface import MODULES

    for path, names in MODULES.items():
        try:
            mod = importlib.import_module(path)
        except ModuleNotFoundError:
            assert API.modules[path] is None, path
            continue
        for n in names:
            assert (n in API.modules[path]["names"]) == hasattr(mod, n), (path, n)
            if n == "KVCacheLayout" and hasattr(mod, n):
                assert describe_enum(S.enums[n]) == describe_enum(getattr(mod, n))


@pytest.mark.parametrize("name", BACKENDS)
def test_shape_answers_equal(name: str) -> None:
    live, stand = real(name), S.backend(name)
    if not hasattr(live, "get_kv_cache_shape"):
        assert not hasattr(stand, "get_kv_cache_shape")
        pytest.skip(f"vLLM {RELEASE}'s {name} has no get_kv_cache_shape")
    dtypes = sorted({a["kwargs"]["cache_dtype_str"] for a in API.backends[name].answers_to("get_kv_cache_shape")
                     if "cache_dtype_str" in a["kwargs"]})
    diff_kv = "head_size_v" in vars(live)

    @LIVE
    @given(nb=st.integers(1, 100_000), bs=st.integers(1, 1024), h=st.integers(1, 128), d=st.integers(1, 1024),
           dtype=st.sampled_from([None, *dtypes]), hv=st.integers(1, 1024))
    def check(nb, bs, h, d, dtype, hv):
        kw = {} if dtype is None else {"cache_dtype_str": dtype}
        with pytest.MonkeyPatch.context() as mp:
            if diff_kv:
                mp.setattr(live, "head_size_v", hv)
                mp.setattr(stand, "head_size_v", hv)
            want = outcome(lambda: live.get_kv_cache_shape(nb, bs, h, d, **kw))
            got = outcome(lambda: stand.get_kv_cache_shape(nb, bs, h, d, **kw))
        COUNTS[(name, "get_kv_cache_shape")] += 1
        assert got == want, (nb, bs, h, d, kw)

    check()


@pytest.mark.parametrize("name", BACKENDS)
def test_stride_order_answers_equal(name: str) -> None:
    live, stand = real(name), S.backend(name)
    if not hasattr(live, "get_kv_cache_stride_order"):
        assert not hasattr(stand, "get_kv_cache_stride_order")
        pytest.skip(f"vLLM {RELEASE}'s {name} has no get_kv_cache_stride_order")

    @LIVE
    @given(setting=st.sampled_from(probe_api.LAYOUT_SETTINGS), flag=st.sampled_from([None, False, True]))
    def check(setting, flag):
        kw = {} if flag is None else {"include_num_layers_dimension": flag}
        with _layout(setting):
            want = outcome(lambda: live.get_kv_cache_stride_order(**kw))
            got = outcome(lambda: stand.get_kv_cache_stride_order(**kw))
        COUNTS[(name, "get_kv_cache_stride_order")] += 1
        assert got == want, (setting, kw)

    check()


@pytest.mark.parametrize("name", BACKENDS)
def test_flags_and_layouts_equal(name: str) -> None:
    live, stand = real(name), S.backend(name)
    for n in (*FLAGS, "supported_kv_cache_layouts"):
        if hasattr(live, n):
            assert outcome(getattr(stand, n)) == outcome(getattr(live, n)), n
            COUNTS[(name, n)] += 1


def test_get_kv_cache_layout_answers_equal() -> None:
    mod = importlib.import_module("vllm.v1.attention.backends.utils")
    if not hasattr(mod, "get_kv_cache_layout"):
        pytest.skip(f"vLLM {RELEASE} has no get_kv_cache_layout")
    stand = S.function("vllm.v1.attention.backends.utils", "get_kv_cache_layout")
    for setting in probe_api.LAYOUT_SETTINGS:
        with _layout(setting):
            assert outcome(stand) == outcome(mod.get_kv_cache_layout), setting
            COUNTS[("module", "get_kv_cache_layout")] += 1


def test_a_bad_keyword_is_refused_as_the_release_refuses_it() -> None:
    for name in BACKENDS:
        live, stand = real(name), S.backend(name)
        for n in ("get_kv_cache_shape", "get_kv_cache_stride_order"):
            if hasattr(live, n):
                assert outcome(lambda: getattr(stand, n)(no_such_argument=1)) == outcome(
                    lambda: getattr(live, n)(no_such_argument=1)) == ("raises", "TypeError")




def test_the_kv_cache_config_stand_in_reads_as_the_release_s_own() -> None:
    import vllm.config

    from harness.handed import model
    from harness.probe import allocation

    record = REC.observations.get("allocations") or {}
    if not record.get("read"):
        pytest.skip(f"vLLM {RELEASE}: the whole-model allocation is not read ({record.get('why', 'no record')})")
    planned = {name: body for name, body in record["models"].items()
               if not {"refused", "raised", "absent"} & body.keys()}
    assert planned
    for name, body in planned.items():
        with allocation.planned(name) as (vllm_config, own):
            assert type(own).__module__.startswith("vllm."), (name, type(own))
            assert model.standing_in(own) == model.config(body), name
            assert vllm.config.get_current_vllm_config() is vllm_config, name
