"""harness.run.loop without pytest: a session, one check over examples of one target, and what it records."""

import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from _pytest.mark.expression import Expression  # noqa: E402
from hypothesis import settings  # noqa: E402

from harness import checks, results  # noqa: E402
from harness.checks.outcome import Outcome  # noqa: E402
from harness.draws import profiles
from harness.recordings import store
from harness.results import (
    Word,  # noqa: E402
    findings,
)
from harness.run import coverage, implementation, loop, regressions  # noqa: E402
from harness.run import session as sessions
from harness.run import targets as targeting

profiles.register()


@pytest.fixture
def session(tmp_path):
    before = settings.get_current_profile_name()
    settings.load_profile("kvconform-ci")  # derandomised, no example database
    yield sessions.start("builtin", ["0.25.1"], store.ROOT, tmp_path / "results", tmp_path / "regressions",
                       findings.DIRECTORY, "cpu", "test-main", "--kvconform-release=0.25.1")
    settings.load_profile(before)


def _run(session, check, examples=3):
    r = loop.Loop(session, "pytest suite::check", examples)
    return r.run(implementation.targets(session)[0], checks.SPLIT_AGREES, check)


def test_a_check_over_a_target_records_one_result_per_example(session):
    def agrees(t):
        return Outcome(Word.BIT_IDENTICAL)

    settled = _run(session, agrees)
    explicit = implementation.of(checks.SPLIT_AGREES).explicit(implementation.targets(session)[0], session.sizes)
    assert len(explicit) == 2  # run first, beside the generated ones
    assert settled.ran == 3 * checks.CHEAP_FACTOR + 2 and not settled.known and settled.failure is None
    rows = results.read(session.results_dir, "0.25.1", "results.*.jsonl")
    assert len(rows) == settled.ran and {r.outcome for r in rows} == {"bit-identical"}
    assert {r.geometry for r in rows} == {implementation.targets(session)[0].geometry}


def test_a_new_finding_raises_with_one_repro_line_and_keeps_the_shrunk_example(session):
    def differs(t):
        return Outcome(Word.DIFFERS, "planted")

    with pytest.raises(loop.NewFinding) as e:
        _run(session, differs)
    repro = str(e.value).splitlines()[-1]
    assert repro.startswith("REPRO split-agrees release=0.25.1 (replay) geometry=")
    assert repro.endswith(tuple(f"-k '[0.25.1- and -{p.stem.split('-')[-1]}]'"
                                for p in (session.regressions_dir / "builtin").glob("*")))
    assert "pytest suite::check --kvconform-release=0.25.1" in repro


def test_the_repro_lines_k_selects_the_replay_item_of_its_release_only(session, tmp_path):
    # Both releases hand the failing geometry, so the kept example is replayed once per release, under one digest.
    def differs(t):
        return Outcome(Word.DIFFERS, "planted")

    with pytest.raises(loop.NewFinding) as e:
        _run(session, differs)
    expression = re.search(r" -k '(.*)'$", str(e.value).splitlines()[-1]).group(1)
    both = sessions.start("builtin", ["0.24.0", "0.25.1"], store.ROOT, tmp_path / "results2",
                          session.regressions_dir, findings.DIRECTORY, "cpu", "test-main", "")
    stored = regressions.regressions(both, checks.SPLIT_AGREES)
    items = [f"test_split_agrees_regression[{regressions.item_id(r.target, r.digest)}]" for r in stored]
    assert len({r.target.release.release for r in stored}) == 2 and len({r.digest for r in stored}) == 1, items

    def selected(expr: str) -> list[str]:  # as pytest's -k matches an item: any of its names, case-insensitively
        compiled = Expression.compile(expr)
        return [i for i in items if compiled.evaluate(lambda word, i=i: word.lower() in i.lower())]

    assert selected(expression) == [i for i in items if "[0.25.1-" in i]
    assert len(selected(stored[0].digest)) == 2  # the digest alone: one item per release


def test_what_the_subject_raises_is_its_outcome_not_a_harness_error(session):
    def raising(t):
        t.call(lambda: 1 / 0)

    with pytest.raises(loop.NewFinding, match="subject-error: ZeroDivisionError"):
        _run(session, raising)


def test_a_bug_in_a_check_is_a_harness_error(session):
    def buggy(t):
        raise KeyError("ours")

    with pytest.raises(KeyError):
        _run(session, buggy)
    rows = results.read(session.results_dir, files="results.*.jsonl")
    assert [r.outcome for r in rows][-1] == "harness-error"


def test_a_known_finding_settles_instead_of_raising(session, tmp_path):
    (tmp_path / "known").mkdir()
    (tmp_path / "known" / "builtin.toml").write_text(
        '[[finding]]\nreleases = "*"\ngeometry = "*"\nsparsity = "*"\ncheck = "split-agrees"\n'
        'outcome = "differs"\nreason = "planted"\nlink = "here"\n')
    session.findings = findings.load("builtin", tmp_path / "known")

    def differs(t):
        return Outcome(Word.DIFFERS, "planted")

    settled = _run(session, differs)
    assert list(settled.known) == ["builtin#1"] and settled.failure is None


def test_outcome_words_are_the_enum():
    assert Outcome("differs").word is Word.DIFFERS and not Word.DIFFERS.passing and Word.REJECTED.passing
    with pytest.raises(ValueError):
        Outcome("passed-ish")


def test_items_run_regressions_then_cheap_checks_then_the_oracle_then_kernels():
    got = sorted([(checks.BIT_IDENTITY, False), (checks.ORACLE, False), (checks.SPLIT_AGREES, False),
                  (checks.DETERMINISM, True)], key=lambda c: targeting.order(*c))
    assert got == [(checks.DETERMINISM, True), (checks.SPLIT_AGREES, False), (checks.ORACLE, False),
                   (checks.BIT_IDENTITY, False)]


def test_the_oracle_targets_are_one_per_sparsity_mode_under_the_newest_release(tmp_path):
    s = sessions.start("builtin", ["0.33.0", "0.11.2"], store.ROOT, tmp_path, tmp_path, findings.DIRECTORY,
                     "cpu", "t", "")
    dense = implementation.targets(s, checks.ORACLE)
    assert [(t.release.release, t.geometry, t.mode) for t in dense] == [
        ("0.33.0", "dense", m) for m in ("none", "skip_softmax", "nm")]


def test_asking_for_nothing_without_vllm_is_a_usage_error(tmp_path):
    with pytest.raises(ValueError, match="name the release"):
        sessions.start("builtin", [], store.ROOT, tmp_path, tmp_path, findings.DIRECTORY, "cpu", "t", "")


def test_a_kept_regression_replays_on_each_release_as_that_release_hands_the_cache(tmp_path):
    # Kept from 0.33.0's cache (a KVCacheLayout member in force); 0.26.0 makes the same geometry under its switch.
    kept = store.ROOT.parent / "regressions" / "example-offloader" / "split-agrees-2ef7fcc97155.json"
    (tmp_path / "builtin").mkdir()
    (tmp_path / "builtin" / kept.name).write_text(kept.read_text())
    s = sessions.start("builtin", ["0.26.0", "0.33.0"], store.ROOT, tmp_path / "results", tmp_path,
                     findings.DIRECTORY, "cpu", "t", "")
    got = {}
    for reg in regressions.regressions(s, checks.SPLIT_AGREES):
        t = loop.Loop(s, "t", 1).trial(reg.target, "split-agrees", reg.example, reg.extra)
        got[reg.target.release.release] = (reg.target.contract.origin.release, t.layer.kv_cache_layout)
    assert got == {"0.26.0": ("0.26.0", "NHD"), "0.33.0": ("0.33.0", "LBNHC")}


def test_a_narrower_run_keeps_the_earlier_runs_other_lines_and_says_stale_of_its_own_lines_only(tmp_path):
    before = settings.get_current_profile_name()
    settings.load_profile("kvconform-ci")
    known = tmp_path / "known"
    known.mkdir()

    def run(name, *which):
        s = sessions.start("builtin", ["0.25.1"], store.ROOT, tmp_path / "results", tmp_path / "regressions",
                         known, "cpu", f"{name}-main", "", run=name)
        for t in which:
            loop.Loop(s, "pytest suite::check", 1).run(implementation.targets(s)[t], checks.SPLIT_AGREES,
                                                       lambda t: Outcome(Word.BIT_IDENTICAL))
        s.sink.merge(s.releases)
        return s

    try:
        g0, g1 = (t.geometry for t in implementation.targets(run("Y", 0, 1))[:2])  # before any known finding
        (known / "builtin.toml").write_text(
            f'[[finding]]\nreleases = "*"\ngeometry = "{g1}"\nsparsity = "*"\ncheck = "split-agrees"\n'
            'outcome = "differs"\nreason = "planted"\nlink = "here"\n')
        plain = run("W")  # runs nothing: what an item of split-agrees draws
        n = checks.CHEAP_FACTOR + len(implementation.of(checks.SPLIT_AGREES).explicit(
            implementation.targets(plain)[0], plain.sizes))  # lines per item
        narrower = run("X", 0)  # the finding covers Y's kept lines only: this run checked none of it, unexercised
        assert f"  merged: 0.25.1: {n} lines of run X replaced {n} of run Y; {n} lines of run Y kept " \
               "(not re-checked)" in narrower.sink.summary(narrower.releases, [], [])
        rows = results.read(tmp_path / "results", "0.25.1")
        assert {(r.run, r.geometry, r.outcome.value) for r in rows} == {("X", g0, "bit-identical"),
                                                                         ("Y", g1, "bit-identical"),
                                                                         ("X", g1, "unexercised")}
        run("Z", 1)  # re-checks what the finding covers: stale, of this run's lines
        rows = results.read(tmp_path / "results", "0.25.1")
        assert [(r.run, r.known) for r in rows if r.outcome == "stale"] == [("Z", "builtin#1")]
        assert {(r.run, r.geometry) for r in rows} == {("X", g0), ("Z", g1)}
    finally:
        settings.load_profile(before)


def test_the_kernel_checks_say_why_they_take_no_diff_kv_cache_naming_the_head_sizes(tmp_path):
    s = sessions.start("builtin", ["0.17.1"], store.ROOT, tmp_path / "results", tmp_path,
                     findings.DIRECTORY, "cpu", "t", "")
    diff_kv = list(dict.fromkeys(c.name for c in s.releases[0].contracts if c.diff_kv))
    assert diff_kv and not set(diff_kv) & {t.geometry for t in implementation.targets(s, checks.BIT_IDENTITY)}
    assert set(diff_kv) <= {t.geometry for t in implementation.targets(s, checks.SPLIT_AGREES)}
    assert coverage.record_outside(s) == 1
    rows = results.read(s.results_dir, files="results.*.jsonl")
    [line] = [r.diagnosis for r in rows if r.check == checks.KV_CHECKS.name]
    assert (f"{len(diff_kv)} geometries ({', '.join(diff_kv)}): the subject's forwards take one "
            "head size for K and V, while a diff-KV cache has two (its examples draw head sizes K 64 / V 32 or "
            "K 64 / V 96 or K 80 / V 48)") in line, line


def test_the_header_names_the_cache_dtypes_a_release_lists_that_kvconform_does_not_model(tmp_path):
    s = sessions.start("builtin", ["0.25.1", "0.19.1"], store.ROOT, tmp_path / "results", tmp_path,
                       findings.DIRECTORY, "cpu", "t", "")
    new, old = coverage.coverage(s)[:2]
    assert ("cache dtypes its backends list that kvconform does not model (no contract recorded): "
            "int4_per_token_head (TRITON_ATTN), int8_per_token_head (TRITON_ATTN)") in new
    assert "does not model" not in old
