"""What a consumer author meets: a malformed cache refused in any natural spelling, a split of the wrong arity named
as the subject's error, supports_layer honoured by every check that hands over a cache, test ids whose words select
one check, a run that says what it leaves unchecked, finding without shrinking, the relayout check, regressions kept
outside kvconform's checkout, and the same examples whether a release is installed or replayed."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from harness import checks
from harness.checks.outcome import Outcome
from harness.draws import profiles, strategies
from harness.recordings import store
from harness.results import findings
from harness.run import implementation, loop
from harness.run import session as sessions
from harness.run import targets as targeting

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import offloader  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
profiles.register()


@pytest.fixture
def ci():
    before = settings.get_current_profile_name()
    settings.load_profile("kvconform-ci")
    yield
    settings.load_profile(before)


def _session(tmp_path, subject, *releases):
    s = sessions.start("builtin", list(releases), store.ROOT, tmp_path / "results", tmp_path / "regressions",
                     findings.DIRECTORY, "cpu", "test-main", "")
    return dataclasses.replace(s, subject=subject, subject_name=subject.name,
                               capabilities=frozenset(subject.capabilities))


class Raising(offloader.Offloader):
    """Refuses every cache it meets by raising `error`."""

    name = "raising"
    capabilities = frozenset({"split"})

    def __init__(self, error):
        self.error = error

    def split(self, kv_cache, layer):
        raise self.error(kv_cache)


class Custom(Exception):
    pass


SPELLINGS = {
    "tuple in a ValueError": lambda t: ValueError(f"bad cache {tuple(t.shape)}"),
    "torch.Size in a RuntimeError": lambda t: RuntimeError(f"expected another layout, got {t.shape}"),
    "list in a custom exception": lambda t: Custom(f"shape {list(t.shape)} is not the cache"),
}


def _malformed(tmp_path, subject):
    s = _session(tmp_path, subject, "0.25.1")
    target = next(t for t in implementation.targets(s, checks.REJECTS_MALFORMED)
                  if t.contract.layout.family == "blocks-first")
    return loop.Loop(s, "t", 1).run(target, checks.REJECTS_MALFORMED)


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_a_refusal_naming_the_shape_in_any_spelling_rejects_the_malformed_cache(tmp_path, ci, spelling):
    settled = _malformed(tmp_path, Raising(SPELLINGS[spelling]))
    explicit = len(implementation.of(checks.REJECTS_MALFORMED).explicit(implementation.targets(
        _session(tmp_path, Raising(SPELLINGS[spelling]), "0.25.1"))[0], strategies.CPU))
    assert settled.ran == checks.CHEAP_FACTOR + explicit and settled.failure is None


def test_a_refusal_naming_no_shape_is_accepted_with_what_it_should_name(tmp_path, ci):
    with pytest.raises(loop.NewFinding) as e:
        _malformed(tmp_path, Raising(lambda t: Custom("wrong cache")))
    first = str(e.value).splitlines()[0]
    assert first.startswith("accepted: ") and "Custom raised without naming the shape as (" in first, first
    assert "torch.Size([" in first and "wrong cache" in first, first


class ThreeViews(offloader.Offloader):
    name = "three-views"
    capabilities = frozenset({"split"})

    def split(self, kv_cache, layer):
        return (*super().split(kv_cache, layer), kv_cache)


def test_a_split_of_the_wrong_arity_is_a_subject_error_naming_what_it_returned(tmp_path, ci):
    s = _session(tmp_path, ThreeViews(), "0.25.1")
    with pytest.raises(loop.NewFinding) as e:
        loop.Loop(s, "t", 1).run(implementation.targets(s)[0], checks.SPLIT_AGREES)
    assert str(e.value).startswith("subject-error: split of kv_cache (") and \
        "returned a tuple of 3 (Tensor, Tensor, Tensor), not a (K, V) pair of tensors" in str(e.value)


class SizeOneStride(offloader.Offloader):
    """The offloader's views, K's head axis restrided where it has one head: the same memory addressed."""

    name = "size-one-stride"
    capabilities = frozenset({"split"})

    def split(self, kv_cache, layer):
        k, v = super().split(kv_cache, layer)
        stride = list(k.stride())
        stride[2] = 12345 if k.shape[2] == 1 else stride[2] + self.shift
        return k.as_strided(k.shape, stride, k.storage_offset()), v

    shift = 0


def test_split_agrees_ignores_the_stride_of_an_axis_of_size_1_and_no_other(tmp_path, ci):
    s = _session(tmp_path, SizeOneStride(), "0.25.1")
    target = implementation.targets(s)[0]
    run = loop.Loop(s, "t", 2)
    assert run.run(target, checks.SPLIT_AGREES).failure is None
    SizeOneStride.shift = 1
    try:
        with pytest.raises(loop.NewFinding, match="K view .*stride"):
            run.run(target, checks.SPLIT_AGREES)
    finally:
        SizeOneStride.shift = 0


class RefusesFp8(offloader.Offloader):
    name = "refuses-fp8"

    def supports_layer(self, layer):
        return "no fp8 caches" if layer.cache_dtype.startswith("fp8") else None

    def split(self, kv_cache, layer):
        if layer.cache_dtype.startswith("fp8"):
            raise AssertionError("an unsupported cache was handed over")
        return super().split(kv_cache, layer)


@pytest.mark.parametrize("check", [checks.SPLIT_AGREES, checks.REJECTS_MALFORMED, checks.TRANSFER])
def test_every_check_that_hands_over_a_cache_asks_supports_layer_first(tmp_path, ci, check):
    s = _session(tmp_path, RefusesFp8(), "0.25.1")
    target = next(t for t in implementation.targets(s, check) if t.contract.cache_dtype == "fp8_e4m3")
    settled = loop.Loop(s, "t", 1).run(target, check)
    assert settled.ran == 0 and settled.unsupported == {"no fp8 caches"}
    assert all(c.hands_cache for c in checks.CHECKS if c.needs & {"split", "transfer"})
    assert not checks.ORACLE.hands_cache and checks.ORACLE.asks_case and not checks.SPLIT_AGREES.asks_case


class RefusesOtherSettings(offloader.Offloader):
    """Tags its payload with the layout it was read under and refuses to inject it under another."""

    name = "refuses-other-settings"

    def extract(self, kv_cache, layer, block_ids):
        return layer.kv_cache_layout, super().extract(kv_cache, layer, block_ids)

    def inject(self, kv_cache, layer, block_ids, payload):
        setting, blocks = payload
        if setting != layer.kv_cache_layout:
            raise ValueError(f"blocks read under {setting} cannot be written under {layer.kv_cache_layout}")
        super().inject(kv_cache, layer, block_ids, blocks)


class WritesThenRefuses(RefusesOtherSettings):
    name = "writes-then-refuses"

    def inject(self, kv_cache, layer, block_ids, payload):
        kv_cache.view(-1)[:1] = 0 if kv_cache.dtype.is_floating_point else 1
        super().inject(kv_cache, layer, block_ids, payload)


def _relayout(tmp_path, subject):
    s = _session(tmp_path, subject, "0.25.1")
    target = next(t for t in implementation.targets(s, checks.RELAYOUT)
                  if t.contract.name == "blocks-first:B.KV.N.H.D" and t.peer.name == "blocks-first:B.KV.H.N.D")
    return loop.Loop(s, "t", 1).run(target, checks.RELAYOUT)


def test_relayout_passes_a_refusal_that_writes_nothing_and_values_moved_through_views(tmp_path, ci):
    assert _relayout(tmp_path, RefusesOtherSettings()).failure is None
    assert _relayout(tmp_path, offloader.Offloader()).failure is None
    rows = [json.loads(line) for p in (tmp_path / "results").rglob("*.jsonl") for line in p.read_text().splitlines()]
    assert {r["outcome"] for r in rows if r["subject"] == "refuses-other-settings"} == {"rejected"}
    assert {r["outcome"] for r in rows if r["subject"] == "example-offloader"} == {"bit-identical"}


def test_relayout_fails_a_refusal_that_wrote_first(tmp_path, ci):
    with pytest.raises(loop.NewFinding, match="inject raised ValueError .* after writing 1 elements"):
        _relayout(tmp_path, WritesThenRefuses())


def test_relayout_targets_pair_every_setting_of_a_backend_in_a_cycle(tmp_path):
    s = _session(tmp_path, offloader.Offloader(), "0.33.0")
    pairs = [(t.contract.name, t.peer.name) for t in implementation.targets(s, checks.RELAYOUT)]
    flash = [p for p in pairs if p[0].startswith("packed:") and "@" not in p[0] and "+" not in p[0]]
    sources, targets = [a for a, _ in flash], [b for _, b in flash]
    assert sorted(sources) == sorted(targets) and len(set(sources)) == len(sources) == 9, flash
    assert all(a.count("L") == b.count("L") for a, b in pairs)  # per-layer with per-layer, cross-layer likewise
    assert ("packed:B.H.N.C", "packed:B.N.H.C") in pairs  # LBHNC -> LBNHC, vLLM #55904's pair


def test_an_items_seed_depends_on_the_check_release_and_geometry_alone(tmp_path):
    s = _session(tmp_path, offloader.Offloader(), "0.25.1")
    a, b = implementation.targets(s)[:2]
    assert targeting.item_seed(0, "split-agrees", a) == targeting.item_seed(0, "split-agrees", dataclasses.replace(a))
    assert len({targeting.item_seed(0, "split-agrees", a), targeting.item_seed(1, "split-agrees", a),
                targeting.item_seed(0, "transfer", a), targeting.item_seed(0, "split-agrees", b)}) == 4
    live = dataclasses.replace(a, release=dataclasses.replace(a.release, source="live", recording=None))
    assert targeting.item_seed(0, "split-agrees", live) == targeting.item_seed(0, "split-agrees", a)


def _pytest(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "examples"), str(REPO)]),
                               **(env or {})})


@pytest.mark.parametrize("word, module", [("split_agrees", "test_split"), ("malformed", "test_malformed"),
                                          ("transfer", "test_transfer"), ("relayout", "test_relayout")])
def test_a_check_word_given_to_k_selects_that_check_alone(tmp_path, word, module):
    done = _pytest(tmp_path, "--pyargs", "kvconform.suites", "--co", "-q", "--kvconform-subject=offloader:Offloader",
                   "--kvconform-release=0.25.1", "--kvconform-release=0.33.0", "-k", word)
    items = [line for line in done.stdout.splitlines() if "::" in line]
    assert done.returncode == 0 and items, done.stdout[-2000:] + done.stderr[-2000:]
    assert all(i.split("::")[0].endswith(f"{module}.py") for i in items), [
        i for i in items if not i.split("::")[0].endswith(f"{module}.py")][:5]


def test_the_header_says_what_a_release_leaves_unchecked_and_the_examples_each_check_draws(tmp_path):
    (tmp_path / "flash_only.py").write_text("import offloader\n\n\nclass FlashOnly(offloader.Offloader):\n"
                                            "    name = 'flash-only'\n    backends = ('FLASH_ATTN',)\n")
    done = _pytest(tmp_path, "--pyargs", "kvconform.suites", "--co", "--kvconform-subject=flash_only:FlashOnly",
                   "--kvconform-release=0.25.1", "--hypothesis-profile=kvconform-find")
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert ("kvconform 0.25.1: flash-only selects 4 of its 25 contracts (4 geometries); not checked: 21 contracts of "
            "FLASHINFER (8), TRITON_ATTN (8), FLEX_ATTENTION (1), FLASH_ATTN_DIFFKV (2), TRITON_MLA (2): not among "
            "the backends flash-only names (FLASH_ATTN)") in out, out[-3000:]
    assert "kvconform examples per geometry: split-agrees 40 + 2 explicit; rejects-malformed 40 + 2 explicit; " \
           "transfer 40 + 2 explicit; relayout 40 + 2 explicit" in out, out[-3000:]
    assert "hypothesis profile kvconform-find (no shrinking: a failing item stops at its first)" in out
    assert "flash-only declares split, transfer: model-transfer, bit-identity, determinism, oracle, ulp-autotuned need more" in out
    release = next(line for line in out.splitlines() if line.startswith("kvconform release 0.25.1"))
    assert release.count("blocks-first x") == 1 and "FLASH_ATTN, FLASHINFER" in release, release


def test_find_stops_a_failing_item_at_its_first_example_and_says_how_to_shrink_it(tmp_path):
    args = ("--pyargs", "kvconform.suites", "--kvconform-subject=offloader:ShapeSniffingReader",
            "--kvconform-release=0.25.1", "--kvconform-backend=FLASH_ATTN", "--kvconform-cache-dtype=auto",
            "-k", "split_agrees and not regression", f"--kvconform-results-dir={tmp_path / 'results'}")
    found = _pytest(tmp_path, *args, "--hypothesis-profile=kvconform-find")
    shrunk = _pytest(tmp_path, *args, "--hypothesis-profile=kvconform-ci",
                     f"--kvconform-results-dir={tmp_path / 'results-ci'}")
    failed = lambda out: sorted(re.findall(r"^FAILED \S+::(\S+)", out, re.M))  # noqa: E731
    assert failed(found.stdout) and failed(found.stdout) == failed(shrunk.stdout), (found.stdout[-2000:],
                                                                                    shrunk.stdout[-2000:])
    assert (f"the first failing example found, not shrunk (kvconform-find); the shrunk one: "
            f"{shlex.quote(sys.executable)} -m pytest ") in found.stdout
    assert "--hypothesis-profile=kvconform-ci" in found.stdout and "not shrunk" not in shrunk.stdout
    rows = lambda d: [json.loads(x) for p in (tmp_path / d).rglob("results.jsonl")  # noqa: E731
                      for x in p.read_text().splitlines()]
    # A failing item's examples end at its first failure: no more lines than a passing item's examples.
    per_item = {}
    for r in rows("results"):
        per_item.setdefault(r["geometry"], []).append(r["outcome"])
    for outcomes in per_item.values():
        assert len(outcomes) <= 40 and outcomes.count("differs") <= 1, outcomes


def test_regressions_of_a_subject_not_kvconforms_own_go_to_the_results_folder(tmp_path):
    done = _pytest(REPO, "conformance", "--kvconform-subject=offloader:ShapeSniffingReader",
                   "--kvconform-release=0.25.1", "--kvconform-backend=FLASH_ATTN", "--kvconform-cache-dtype=auto",
                   "-k", "split_agrees and not regression", "--hypothesis-profile=kvconform-find",
                   f"--kvconform-results-dir={tmp_path / 'results'}")
    assert done.returncode == 1, done.stdout[-2000:]
    kept = list((tmp_path / "results" / "regressions" / "example-shape-sniffing-reader").glob("split-agrees-*.json"))
    assert kept, done.stdout[-2000:]
    assert not (REPO / "fixtures" / "regressions" / "example-shape-sniffing-reader").exists()


def _drawn(tmp_path, session):
    target = next(t for t in implementation.targets(session, checks.REJECTS_MALFORMED) if t.contract.cache_dtype == "fp8_e4m3")
    seen = []

    def record(t):
        seen.append(t.example.digest())
        return Outcome("rejected")

    # 300 generated examples: a view check draws at least max_examples.
    loop.Loop(session, "t", 300).run(target, checks.REJECTS_MALFORMED, record)
    return seen


def test_an_item_draws_the_same_examples_whatever_local_modules_are_loaded(tmp_path, ci, monkeypatch):
    # Hypothesis draws literal constants of the modules loaded from outside site-packages now and then; live, the
    # probe's modules are loaded, in replay they are not.
    s = _session(tmp_path, offloader.Offloader(), "0.25.1")
    before = _drawn(tmp_path, s)
    (tmp_path / "local_constants.py").write_text("".join(f"C{i} = {n}\n" for i, n in enumerate(
        (1234, 4097, 8191, 65535, 3, 7, 31, 63, 127, 255, 511, 1023, 2047, 12345, 54321))))
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("local_constants")
    assert _drawn(tmp_path, s) == before and len(before) > 300
