"""Contracts beyond FlashAttention's model-dtype ones: FlashInfer's heads-axis NVFP4 split, Triton's padded
per-token-head split, diff-KV's unequal K/V head dims, FP8 views and MLA's latent cache. Each form round-trips
tokens through its split, and a subject with the split a backend does not use fails, with a REPRO line. vLLM's
layout setting (harness.backends.layout_env) is set, its cached reads cleared, and both restored."""

import functools
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import recorded
import torch

from harness.backends import LAYOUT_ENV, layout_env
from harness.contract import Contract, ContractError, Dims, cache_dtype, cross_layer, views
from harness.handed.cache import paging, read, write
from harness.recordings.store import save

REPO = Path(__file__).resolve().parent.parent

PACKED = Contract.of(("B", "H", "N", "C"), ("B", "H", "N", "C"), "vllm 0.33.0 FLASHINFER LBHNC single-layer")
NVFP4 = Contract.of(("B", "S", "N", "D"), ("B", "S", "N", "D"), "vllm 0.33.0 FLASHINFER LBHNC single-layer", "nvfp4")
FP8 = Contract.of(("B", "H", "N", "C"), ("B", "N", "H", "C"), "vllm 0.33.0 TRITON_ATTN LBNHC single-layer", "fp8_e4m3")
PTH = Contract.of(("B", "H", "N", "C"), ("B", "H", "N", "C"), "vllm 0.33.0 TRITON_ATTN LBHNC single-layer",
               "fp8_per_token_head")
DIFF = Contract.of(("B", "N", "H", "C"), ("B", "N", "H", "C"), "vllm 0.22.1 FLASH_ATTN_DIFFKV NHD", diff_kv=True)
LATENT = Contract.of(("B", "H", "N", "R"), ("B", "H", "N", "R"), "vllm 0.33.0 TRITON_MLA LBHNC single-layer")
FORMS = [PACKED, NVFP4, FP8, PTH, DIFF, cross_layer(NVFP4, False), cross_layer(PTH, True),
         Contract.of(("B", "KV", "N", "H", "D"), ("B", "KV", "H", "N", "D"), cache_dtype="nvfp4"),
         Contract.of(("B", "KV", "N", "H", "D"), ("B", "KV", "N", "H", "D"), cache_dtype="fp8_per_token_head")]


def dims_for(c: Contract) -> Dims:
    return Dims(5, 16, 2, 32, num_layers=3 if c.layout.shared else 1, layer=1 if c.layout.shared else 0,
                head_dim_v=24 if c.diff_kv else 0)


def tokens(c: Contract, d: Dims, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (c.dtype.stored(torch.randn(n, d.kv_heads, d.head_dim, generator=g, dtype=torch.float16)),
            c.dtype.stored(torch.randn(n, d.kv_heads, d.v_dim, generator=g, dtype=torch.float16)))


@pytest.mark.parametrize("c", FORMS, ids=lambda c: c.name)
def test_every_form_round_trips_tokens_through_its_split(c):
    d = dims_for(c)
    pages = paging((40, 20), d.block_size, d.num_blocks, "shuffled", 3)
    k, v = tokens(c, d, 60)
    kv_cache = views.allocate(c, d, torch.float16)
    assert kv_cache.dtype == c.dtype.cache_element(torch.float16)
    write(*views.split(c, kv_cache, d), pages, k, v)
    got_k, got_v = read(*views.split(c, kv_cache, d), pages)
    assert torch.equal(got_k.view(torch.uint8), k.view(torch.uint8))
    assert torch.equal(got_v.view(torch.uint8), v.view(torch.uint8))
    geo = views.geometry(c, d)
    assert geo.k.shape == (d.num_blocks, d.block_size, d.kv_heads, c.dtype.width(d.head_dim))
    assert geo.v.shape == (d.num_blocks, d.block_size, d.kv_heads, c.dtype.width(d.v_dim))
    assert Contract.from_json(c.to_json()) == c


def test_nvfp4_k_and_v_are_the_two_halves_of_the_heads_axis():
    d = dims_for(NVFP4)
    kv_cache = views.allocate(NVFP4, d, torch.float16)
    assert tuple(kv_cache.shape) == (5, 4, 16, 18)  # (B, 2H, N, D/2 + D/16), as FlashInfer's customize_spec
    k, v = views.split(NVFP4, kv_cache, d)
    assert k.data_ptr() == kv_cache[:, :2].data_ptr() and v.data_ptr() == kv_cache[:, 2:].data_ptr()
    with pytest.raises(ContractError, match="opaque bytes"):
        NVFP4.dtype.data(k, d.head_dim)


def test_per_token_head_sides_are_padded_by_their_inline_scale():
    d = dims_for(PTH)
    kv_cache = views.allocate(PTH, d, torch.float16)
    assert tuple(kv_cache.shape) == (5, 2, 16, 72) and kv_cache.dtype == torch.uint8  # 2 * (32 + 4)
    k, v = views.split(PTH, kv_cache, d)
    assert k.dtype == torch.float8_e4m3fn and k.shape[-1] == v.shape[-1] == 36
    rows_k, rows_v = tokens(PTH, d, 1)
    k[0, 0] = rows_k[0]
    assert torch.equal(PTH.dtype.scales(k, 32)[0, 0], torch.ones(2, 1))
    assert torch.equal(PTH.dtype.data(k, 32)[0, 0].float(), rows_k[0, :, :32].float())


def test_fp8_views_are_retyped_byte_caches():
    d = dims_for(FP8)
    kv_cache = views.allocate(FP8, d, torch.bfloat16)
    assert kv_cache.dtype == torch.uint8 and bool((kv_cache == 0xFF).all())  # poisoned: NaN as e4m3
    k, _ = views.split(FP8, kv_cache, d)
    assert k.dtype == torch.float8_e4m3fn and bool(k.float().isnan().all())
    with pytest.raises(ContractError, match="element type torch.bfloat16, expected torch.uint8"):
        views.split(FP8, torch.zeros(5, 2, 16, 64, dtype=torch.bfloat16))


def test_a_wrong_split_of_a_diff_kv_cache_reads_other_tokens():
    d = dims_for(DIFF)
    pages = paging((30,), d.block_size, d.num_blocks, "reversed")
    k, v = tokens(DIFF, d, 30, seed=1)
    kv_cache = views.allocate(DIFF, d, torch.float16)
    write(*views.split(DIFF, kv_cache, d), pages, k, v)
    assert tuple(kv_cache.shape) == (5, 16, 2, 56)  # C = 32 + 24
    t = kv_cache  # already [B, N, H, C]
    halves = (t[..., :28], t[..., 28:])  # the equal-halves split FlashAttention's packed family uses
    wrong_k, _ = read(*halves, pages)
    assert wrong_k.shape != k.shape or not torch.equal(wrong_k, k)
    with pytest.raises(ContractError, match="diff-KV split needs the dims"):
        views.split(DIFF, kv_cache)
    with pytest.raises(ContractError, match="V head dim 24 != K head dim 32"):
        views.allocate(PACKED, d, torch.float16)


def test_latent_cache_has_one_view_and_no_pair():
    d = Dims(5, 16, 1, 576)
    kv_cache = views.allocate(LATENT, d, torch.float16)
    assert tuple(views.latent_view(LATENT, kv_cache, d).shape) == (5, 16, 576)
    with pytest.raises(ContractError, match="holds no K/V pair"):
        views.split(LATENT, kv_cache, d)
    with pytest.raises(ContractError, match="one head slot"):
        views.allocate(LATENT, Dims(5, 16, 2, 576), torch.float16)


@pytest.mark.parametrize("bad, match", [
    (lambda: Contract.of(("B", "S", "N", "C"), ("B", "S", "N", "C")), "unknown logical layout"),
    (lambda: Contract.of(("B", "H", "N", "C"), ("B", "H", "N", "C"), cache_dtype="int4_per_token_head"),
     "unknown cache dtype 'int4_per_token_head'"),
    (lambda: Contract.of(("KV", "B", "N", "H", "D"), ("KV", "B", "N", "H", "D"), diff_kv=True), "packed in C"),
    (lambda: Contract.of(("B", "N", "R"), ("B", "N", "R"), cache_dtype="nvfp4"), "latent cache in nvfp4"),
    (lambda: Contract.of(("B", "H", "N", "C"), ("B", "H", "N", "C"), cache_dtype="nvfp4", diff_kv=True),
     "unequal K/V head dims in a nvfp4 cache"),
])
def test_inexpressible_contracts_are_rejected_by_name(bad, match):
    with pytest.raises(ContractError, match=match):
        bad()


# ---- through the suites: a consumer with FlashAttention's split on other backends' contracts ------------------


class ContentAxisConsumer:
    """A KV-cache consumer written for FlashAttention's packed cache: K and V are the halves of the last axis of
    kv_cache.transpose(1, 2), whatever the backend."""

    name = "content-axis-consumer"
    capabilities = frozenset({"split"})

    def split(self, kv_cache, layer):
        t = kv_cache.transpose(1, 2)
        if cache_dtype(layer.cache_dtype).view is not None:
            t = t.view(cache_dtype(layer.cache_dtype).view)
        half = t.shape[-1] // 2
        return t[..., :half], t[..., half:]


class HeadSizeSplit(ContentAxisConsumer):
    """Splits the content axis at the head size, as Triton's model-dtype path does (its per-token-head path splits
    at the padded half, head size + the inline scale)."""

    name = "head-size-split"

    def split(self, kv_cache, layer):
        t = kv_cache.transpose(1, 2)
        if cache_dtype(layer.cache_dtype).view is not None:
            t = t.view(cache_dtype(layer.cache_dtype).view)
        head = t.shape[-1] // 2 - (4 if layer.cache_dtype == "fp8_per_token_head" else 0)
        return t[..., :head], t[..., head:]


def _suites(root: Path, out: Path, subject: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """The suites over `root`'s recordings of 0.33.0 in a fresh process, results and regressions under `out`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--hypothesis-profile=kvconform-ci",
           f"--kvconform-subject={subject}", f"--kvconform-contracts-dir={root / 'contracts'}",
           f"--kvconform-results-dir={out / 'results'}", f"--kvconform-regressions-dir={out / 'regressions'}",
           f"--kvconform-known-findings={root / 'known'}", "--kvconform-release=0.33.0", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def suites(root: Path, subject: str, *args: str) -> subprocess.CompletedProcess:
    return _suites(root, root, f"test_backends:{subject}", "--kvconform-max-examples=4", "conformance/test_split.py",
                   *args, timeout=600)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("backends")
    diff = recorded.geometries("0.33.0", ["packed:B.H.N.C+diffkv"])  # FLASH_ATTN_DIFFKV's model-dtype cache
    save(recorded.cut("0.33.0", (PACKED, NVFP4, FP8, PTH, *diff, LATENT)), root / "contracts")
    return root


def verdicts(out: str) -> dict[str, str]:
    return {node.split("[")[-1].rstrip("]"): word
            for word, node in re.findall(r"^(PASSED|FAILED) (\S+)", out, re.M) if "regression" not in node}


def test_flash_attention_split_fails_flashinfer_nvfp4_and_passes_its_model_dtype_contract(layouts):
    done = suites(layouts, "ContentAxisConsumer", "--kvconform-backend=FLASHINFER")
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    assert verdicts(out) == {"0.33.0-packed:B.H.N.C": "PASSED", "0.33.0-head-slots:B.S.N.D@nvfp4": "FAILED"}, out
    (repro,) = re.findall(r"^E\s+(REPRO .*)$", out, re.M)
    assert "geometry=head-slots:B.S.N.D@nvfp4" in repro and "--kvconform-backend=FLASHINFER" in repro
    # The heads axis S = 2 * kv_heads read as tokens' heads, each row cut in half: the wrong shape, named.
    b, s, n, w, h = map(int, re.search(r"differs: K view of kv_cache \((\d+), (\d+), (\d+), (\d+)\) strides .*: shape "
                                       r"\(\d+, \d+, \d+, \d+\) \(contract: \(\d+, \d+, (\d+), \d+\)\)", out).groups())
    assert s == 2 * h and f"shape ({b}, {n}, {s}, {w // 2}) (contract: ({b}, {n}, {h}, {w}))" in out


def test_head_size_split_fails_the_padded_per_token_head_contract_only(layouts):
    done = suites(layouts, "HeadSizeSplit", "--kvconform-backend=TRITON_ATTN")
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    assert verdicts(out) == {"0.33.0-packed:B.N.H.C@fp8_e4m3": "PASSED",
                             "0.33.0-packed:B.H.N.C@fp8_per_token_head": "FAILED"}, out
    assert len(re.findall(r"^E\s+REPRO split-agrees release=0.33.0 .*fp8_per_token_head", out, re.M)) == 1


def test_diff_kv_geometries_are_split_checked_and_latent_ones_reported_not_applicable(layouts):
    # Halves of C are K and V only where V is as wide as K: a diff-KV cache's V has its own head dim.
    done = suites(layouts, "ContentAxisConsumer", "--kvconform-backend=FLASH_ATTN_DIFFKV",
                  "--kvconform-backend=TRITON_MLA")
    assert done.returncode == 1, done.stdout[-3000:]
    assert verdicts(done.stdout) == {"0.33.0-packed:B.H.N.C+diffkv": "FAILED"}, done.stdout[-3000:]
    assert re.search(r"^E\s+REPRO split-agrees release=0.33.0 .*geometry=packed:B.H.N.C\+diffkv .*head_dim_v=\d+ ",
                     done.stdout, re.M), done.stdout[-3000:]
    lines = (layouts / "results" / "0.33.0" / "results.jsonl").read_text().splitlines()
    na = [x for x in lines if '"K/V checks"' in x]
    assert len(na) == 1 and "not-applicable" in na[0] and "latent" in na[0] and "diff-KV" not in na[0], lines


def kernels(root: Path, subject: str, *args: str) -> subprocess.CompletedProcess:
    return _suites(root, root / subject, subject, "--kvconform-max-examples=3",
                   "conformance/test_bit_identity.py::test_bit_identity", *args, timeout=900)


def test_builtin_reads_fp8_caches_bit_identically_and_says_why_it_skips_nvfp4(layouts):
    done = kernels(layouts, "builtin", "--kvconform-backend=FLASHINFER", "--kvconform-backend=TRITON_ATTN")
    out = done.stdout
    assert done.returncode == 0, out[-3000:]
    assert verdicts(out) == {"0.33.0-packed:B.H.N.C": "PASSED", "0.33.0-packed:B.N.H.C@fp8_e4m3": "PASSED"}, out
    skipped = re.findall(r"^SKIPPED \[1\] .*builtin supports none of the examples: cache dtype (\w+) not supported", out,
                         re.M)
    assert sorted(skipped) == ["fp8_per_token_head", "nvfp4"], out  # unsupported: a skip with its reason, no pass


def test_a_planted_stride_bug_fails_on_the_fp8_cache(layouts):
    done = kernels(layouts, "mutant:kv_stride_axis", "--kvconform-cache-dtype=fp8_e4m3")
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    assert verdicts(out) == {"0.33.0-packed:B.N.H.C@fp8_e4m3": "FAILED"}, out
    assert re.search(r"^E\s+REPRO bit-identity release=0.33.0 .*geometry=packed:B.N.H.C@fp8_e4m3", out, re.M)


# ---- harness.backends: vLLM's layout setting
# -------------------------------------------------------------------


def _cached_reader(monkeypatch, module: str, name: str, calls: list) -> None:
    """A vLLM module holding an lru_cached read of the layout setting, as the releases before KVCacheLayout hold."""

    @functools.lru_cache
    def read(*_):
        calls.append(os.environ.get(LAYOUT_ENV))
        return calls[-1]

    fake = types.ModuleType(module)
    setattr(fake, name, read)
    monkeypatch.setitem(sys.modules, module, fake)


@pytest.fixture
def readers(monkeypatch):
    """get_kv_cache_layout and vllm.envs' __getattr__ as fakes; calls to each reach the environment when uncached."""
    calls = {"layout": [], "envs": []}
    _cached_reader(monkeypatch, "vllm.v1.attention.backends.utils", "get_kv_cache_layout", calls["layout"])
    _cached_reader(monkeypatch, "vllm.envs", "__getattr__", calls["envs"])
    return (lambda: sys.modules["vllm.v1.attention.backends.utils"].get_kv_cache_layout(),
            lambda: sys.modules["vllm.envs"].__getattr__(LAYOUT_ENV))


def test_layout_env_sets_the_setting_clears_cached_reads_and_restores_both(monkeypatch, readers):
    monkeypatch.setenv(LAYOUT_ENV, "HND")
    assert [read() for read in readers] == ["HND", "HND"]  # now cached
    with layout_env("NHD"):
        assert os.environ[LAYOUT_ENV] == "NHD"
        assert [read() for read in readers] == ["NHD", "NHD"]
    assert os.environ[LAYOUT_ENV] == "HND"
    assert [read() for read in readers] == ["HND", "HND"]


def test_layout_env_leaves_an_unset_setting_unset_and_unsets_for_none(monkeypatch, readers):
    monkeypatch.delenv(LAYOUT_ENV, raising=False)
    with pytest.raises(RuntimeError, match="inside"):
        with layout_env("HND"):
            assert [read() for read in readers] == ["HND", "HND"]
            raise RuntimeError("inside")
    assert LAYOUT_ENV not in os.environ and [read() for read in readers] == [None, None]
    monkeypatch.setenv(LAYOUT_ENV, "NHD")
    with layout_env(None):
        assert LAYOUT_ENV not in os.environ and [read() for read in readers] == [None, None]
    assert [read() for read in readers] == ["NHD", "NHD"]


def test_layout_env_clears_a_reader_cached_after_it_was_entered(monkeypatch):
    # vllm.envs.enable_envs_cache() wraps __getattr__ in a cache while a release runs.
    monkeypatch.setenv(LAYOUT_ENV, "NHD")
    with layout_env("HND"):
        calls: list = []
        _cached_reader(monkeypatch, "vllm.envs", "__getattr__", calls)
        assert sys.modules["vllm.envs"].__getattr__(LAYOUT_ENV) == "HND"
    assert sys.modules["vllm.envs"].__getattr__(LAYOUT_ENV) == "NHD"


def test_layout_env_needs_no_vllm_and_the_module_imports_nothing_of_harness(monkeypatch):
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    with layout_env("HND"):
        assert os.environ[LAYOUT_ENV] == "HND"
    done = subprocess.run([sys.executable, "-c", "import sys, harness.backends; print(sorted(m for m in "
                           "sys.modules if m.split('.')[0] in ('harness', 'vllm', 'torch')))"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["['harness',", "'harness.backends']"], done.stderr
