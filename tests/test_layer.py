"""The layer value (harness.handed.layer): what a release hands a layer, read through its recorded API. kvconform's own
reading of it gives back every recorded contract; consumers written as real ones decide (examples/offloader.py) are
right and wrong exactly where their rules say."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from harness import checks, results
from harness.contract import ContractError, Dims, views
from harness.draws import profiles
from harness.handed.layer import contract_of, in_force, layer_for, setting_of
from harness.recordings import store
from harness.results import Word, findings
from harness.run import implementation, loop, releases
from harness.run import session as sessions
from harness.vllm_api import backend_class

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import offloader  # noqa: E402

profiles.register()
RELEASES = {name: releases.load_release(name, store.ROOT) for name in store.releases()}
# Every recorded K/V geometry, once per release, with the setting it was first read under.
GEOMETRIES = [(r, c) for r in RELEASES.values() for c in dict.fromkeys(c for c in r.contracts if not c.layout.latent)]


DIFF_KV_V = 32  # V's head dim where a diff-KV contract has its own, beside K's 64


def _dims(c, num_blocks: int = 5, head_dim_v: int = 0) -> Dims:
    _, cross = setting_of(c)
    return Dims(num_blocks, 16, 2, 64, 3 if cross else 1, 1 if cross else 0, head_dim_v)


def _all_dims(c) -> list[Dims]:
    """The dims each consumer is tried at: 2 and 5 blocks; on a diff-KV contract with V's head dim K's and its own."""
    return [_dims(c, n, v) for n in (2, 5) for v in ((0, DIFF_KV_V) if c.diff_kv else (0,))]


def test_reading_the_layer_through_the_api_gives_every_recorded_contract():
    assert len(GEOMETRIES) > 500
    wrong = []
    for r, c in GEOMETRIES:
        got = contract_of(sessions.layer_of(r, c, _dims(c), torch.bfloat16))
        if got != c:  # layout, cache dtype and diff-KV (a contract's origin is not compared)
            wrong.append(f"{r.release} {c.origin}: {got.name} != {c.name}")
    assert not wrong, wrong[:10]


def test_a_layer_under_another_setting_reads_another_layout():
    # The check can fail: the same cache told the other stride-order setting is read in the other order.
    r = RELEASES["0.25.1"]
    c = next(c for c in r.contracts if str(c.origin).endswith("FLASH_ATTN VLLM_KV_CACHE_LAYOUT=HND"))
    layer = sessions.layer_of(r, c, _dims(c), torch.float16)
    import dataclasses

    assert contract_of(layer) == c
    assert contract_of(dataclasses.replace(layer, kv_cache_layout="NHD")).layout.physical != c.layout.physical


def test_in_force_serves_the_release_modules_and_its_setting():
    r = RELEASES["0.25.1"]
    c = next(c for c in r.contracts if str(c.origin).endswith("FLASH_ATTN VLLM_KV_CACHE_LAYOUT=HND"))
    layer = sessions.layer_of(r, c, _dims(c), torch.float16)
    with in_force(layer):
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        assert FlashAttentionBackend is layer.backend
        assert FlashAttentionBackend.get_kv_cache_stride_order() == (0, 1, 3, 2, 4)  # HND, as recorded
    assert "vllm" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        import vllm  # noqa: F401


def test_an_unknown_recorded_setting_is_refused_by_name():
    c = RELEASES["0.25.1"].contracts[0]
    import dataclasses

    from harness.contract import Origin

    odd = dataclasses.replace(c, origin=Origin("0.25.1", "FLASH_ATTN", "VLLM_KV_CACHE_LAYOUT=NHD sideways"))
    with pytest.raises(ContractError, match="unknown word 'sideways'"):
        layer_for(odd, _dims(c), torch.float16, backend_class(RELEASES["0.25.1"].recording, "FLASH_ATTN"), "0.25.1",
                  RELEASES["0.25.1"].recording)


def _wrong(subject, r, c, dims: Dims) -> bool:
    kv = views.allocate(c, dims, torch.bfloat16)
    layer = sessions.layer_of(r, c, dims, torch.bfloat16)
    try:
        with in_force(layer):
            got = subject.split(kv, layer)
    except Exception:  # noqa: BLE001 - a refusal of a valid cache is as wrong as a wrong view
        return True
    want = views.split(c, kv, dims)
    return any((a.shape, a.stride(), a.storage_offset(), a.dtype) != (b.shape, b.stride(), b.storage_offset(), b.dtype)
               for a, b in zip(got, want))


class HalvesC(offloader.Offloader):
    """Names the axes as the Offloader does, then takes K and V as the halves of C whatever V's head size."""

    name = "halves-c"

    def split(self, kv_cache, layer):
        k, v = super().split(kv_cache, layer)  # its refusal of a tensor the backend does not describe
        axes = offloader.asked_axes(layer)
        if "C" not in axes:
            return k, v
        t = offloader.typed(kv_cache, layer).permute([axes.index(a) for a in ("B", "N", "H", "C")])
        half = t.shape[-1] // 2
        return t[..., :half], t[..., half:]


def _unequal(c, d: Dims) -> bool:
    return c.diff_kv and d.v_dim != d.head_dim


# Each example's rule, stated before running it: where it must take the wrong views (or refuse a valid cache).
RULES = {
    # Names every axis by asking; without get_kv_cache_shape reads [B, H, N, C], NVFP4's as [B, 2H, N, D]; splits C
    # at K's stored width: never.
    offloader.Offloader: lambda c, d: False,
    # Knows only the two 5-axis families.
    offloader.BlocksFirstConnector: lambda c, d: len(c.layout.logical) != 5,
    # A first axis of 2 is kv-first: wrong on blocks-first with 2 blocks; 4 axes are [B, H, N, 2D]: wrong on
    # NVFP4's [B, 2H, N, D], on the diff-KV token-major [B, N, H, C], and on every diff-KV cache whose V is not as
    # wide as K (C is not two halves).
    offloader.ShapeSniffingReader: lambda c, d: (len(c.layout.logical) == 4
                                                 and c.layout.logical != ("B", "H", "N", "C"))
    or (c.layout.family == "blocks-first" and d.num_blocks == 2) or _unequal(c, d),
    # Halves C: wrong on every diff-KV geometry whose V head dim is not K's.
    HalvesC: _unequal,
}


@pytest.mark.parametrize("example", list(RULES), ids=lambda e: e.__name__)
def test_each_example_consumer_is_wrong_exactly_where_its_rule_says(example):
    subject, rule = example(), RULES[example]
    tried = [(r, c, d) for r, c in GEOMETRIES for d in _all_dims(c)]
    assert any(_unequal(c, d) for _, c, d in tried)
    got = {(r.release, c.name, d) for r, c, d in tried if _wrong(subject, r, c, d)}
    want = {(r.release, c.name, d) for r, c, d in tried if rule(c, d)}
    assert got == want, (sorted(got - want, key=str)[:8], sorted(want - got, key=str)[:8])
    assert example is offloader.Offloader or got  # the rules of the wrong ones are not empty


@pytest.fixture
def diff_kv_session(tmp_path):
    """The diff-KV geometries of one packed-tokens and one packed release, derandomised."""
    before = settings.get_current_profile_name()
    settings.load_profile("kvconform-ci")

    def start(subject):
        s = sessions.start("offloader:Offloader", ["0.17.1", "0.33.0"], store.ROOT, tmp_path / "results",
                         tmp_path / "regressions", findings.DIRECTORY, "cpu", "test-main", "",
                         ("FLASH_ATTN_DIFFKV",))
        return dataclasses.replace(s, subject=subject, subject_name=subject.name)

    yield start
    settings.load_profile(before)


class StacksKV(offloader.Offloader):
    """The Offloader's views, its payload one tensor of K's blocks and V's stacked (which needs them equally wide)."""

    name = "stacks-kv"

    def extract(self, kv_cache, layer, block_ids):
        k, v = self.split(kv_cache, layer)
        return torch.stack([k[block_ids], v[block_ids]])


def _caught(s, check) -> dict[tuple[str, str], str]:
    """Each target of `check` that the runner finds a new finding on, with its message."""
    caught = {}
    for t in implementation.targets(s, check):
        try:
            loop.Loop(s, "pytest x", 1).run(t, check)
        except loop.NewFinding as e:
            caught[t.release.release, t.geometry] = str(e)
    return caught


def _diff_kv_geometries(s, check) -> set[tuple[str, str]]:
    got = {(t.release.release, t.geometry) for t in implementation.targets(s, check)}
    assert len(got) > 10 and all(g.endswith(("+diffkv", "+diffkv@fp8_e4m3")) for _, g in got)
    return got


def _green(s) -> None:
    rows = [r for r in results.read(s.results_dir, files="results.*.jsonl") if r.subject == s.subject_name]
    assert rows and {r.outcome for r in rows} == {Word.BIT_IDENTICAL}


def test_split_agrees_catches_halving_c_on_every_diff_kv_geometry_and_passes_the_offloader(diff_kv_session):
    s = diff_kv_session(HalvesC())
    caught = _caught(s, checks.SPLIT_AGREES)
    assert set(caught) == _diff_kv_geometries(s, checks.SPLIT_AGREES)
    for text in caught.values():
        assert text.startswith("differs: K view of kv_cache") and " head_dim_v=" in text.splitlines()[-1], text
    s = diff_kv_session(offloader.Offloader())
    assert _caught(s, checks.SPLIT_AGREES) == {}
    _green(s)


def test_transfer_catches_a_payload_that_needs_k_and_v_equally_wide_and_passes_whole_rows(diff_kv_session):
    # Transfer judges the bytes moved: halves of C still move every element of a block, so halving C passes it (the
    # wrong views are split-agrees' finding). A payload stacking K and V needs them equally wide: every diff-KV
    # geometry now refuses it.
    s = diff_kv_session(StacksKV())
    caught = _caught(s, checks.TRANSFER)
    assert set(caught) == _diff_kv_geometries(s, checks.TRANSFER)
    assert all(text.startswith("subject-error: RuntimeError: stack expects each tensor to be equal size")
               and " head_dim_v=" in text.splitlines()[-1] for text in caught.values()), caught
    for subject in (HalvesC(), offloader.Offloader()):
        s = diff_kv_session(subject)
        assert _caught(s, checks.TRANSFER) == {}, subject.name
    _green(s)


def test_a_consumer_meets_every_cache_and_a_kernel_says_what_it_does_not_read():
    r = RELEASES["0.33.0"]
    c = next(c for c in r.contracts if c.cache_dtype == "nvfp4")
    layer = sessions.layer_of(r, c, _dims(c), torch.bfloat16)
    assert sessions.supports_layer(offloader.Offloader(), "o", layer, frozenset({"split", "transfer"})) is None
    why = sessions.supports_layer(object(), "k", layer, frozenset({"split", "forward"}))
    assert why and "nvfp4" in why and "supports_layer" in why
