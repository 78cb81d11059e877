"""Result lines: per-worker files merged into one file per release; outcome words checked."""

import dataclasses
import json
import re

import pytest

from harness import results
from harness.results import Result


def result(release="0.30.0", outcome="bit-identical", **kw):
    return Result(**{"run": "r", "release": release, "source": "replay", "subject": "builtin",
                     "geometry": "kv-first:KV.B.N.H.D", "check": "bit-identity", "sparsity": "none",
                     "outcome": outcome, **kw})


def test_workers_merge_into_one_file_and_replace_the_previous_run(tmp_path):
    results.append(tmp_path, result(case="a"), "gw0")
    results.append(tmp_path, result(case="b"), "gw1")
    results.append(tmp_path, result("0.9.2", case="c"), "gw1")
    results.merge(tmp_path, "0.30.0")
    assert sorted(r.case for r in results.read(tmp_path)) == ["a", "b"]  # 0.9.2 is not merged yet
    assert not list((tmp_path / "0.30.0").glob("results.gw*.jsonl"))
    results.append(tmp_path, result(case="d"), "gw0")
    results.merge(tmp_path, "0.30.0")
    results.merge(tmp_path, "0.9.2")
    assert sorted(r.case for r in results.read(tmp_path)) == ["c", "d"]


def test_lines_are_plain_json_with_every_field(tmp_path):
    results.append(tmp_path, result(outcome="differs", diagnosis="3 of 8 differ", repro="REPRO ..."), "main")
    path = results.merge(tmp_path, "0.30.0").path
    line = json.loads(path.read_text())
    assert set(line) == {"release", "source", "subject", "geometry", "check", "sparsity", "outcome", "case",
                         "repro", "diagnosis", "known", "device", "run", "time", "seconds", "backends", "cache_dtype",
                         "family", "order", "layers", "schema", "build"}
    assert line["outcome"] == "differs" and line["diagnosis"] == "3 of 8 differ"
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", line["time"])  # stamped when written


def test_run_ids_are_unique():
    assert len({results.new_run_id() for _ in range(100)}) == 100


def test_unknown_outcome_words_are_refused():
    with pytest.raises(ValueError, match="unknown outcome 'pass'"):
        result(outcome="pass")


def test_a_corrupt_line_names_its_file(tmp_path):
    (tmp_path / "0.1.0").mkdir()
    (tmp_path / "0.1.0" / "results.jsonl").write_text('{"release": "0.1.0"}\n')
    with pytest.raises(ValueError, match="results.jsonl:1"):
        results.read(tmp_path)


def test_install_errors_are_recorded_by_command(tmp_path):
    assert results.main(["install-error", "0.8.5.post1", "no wheel for cp312", "--dir", str(tmp_path)]) == 0
    [r] = results.read(tmp_path)
    assert (r.release, r.outcome, r.diagnosis) == ("0.8.5.post1", "install-error", "no wheel for cp312")


def test_a_session_that_checked_nothing_keeps_the_previous_run(tmp_path):
    results.append(tmp_path, result(case="a"), "gw0")
    results.merge(tmp_path, "0.30.0")
    results.merge(tmp_path, "0.30.0")
    assert [r.case for r in results.read(tmp_path)] == ["a"]


def test_an_older_result_line_is_refused_naming_its_file_and_line(tmp_path):
    (tmp_path / "0.30.0").mkdir()
    old = {"release": "0.30.0", "source": "replay", "subject": "builtin", "geometry": "g", "check": "bit-identity",
           "sparsity": "none", "outcome": "bit-identical"}
    (tmp_path / "0.30.0" / "results.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(ValueError, match=r"0\.30\.0/results\.jsonl:1: a result line of another kvconform \(schema 1"):
        results.read(tmp_path)


def test_the_outcome_is_a_word():
    assert result(outcome="differs").outcome is results.Word.DIFFERS


def test_a_run_replaces_its_own_subject_and_keeps_the_others(tmp_path):
    results.append(tmp_path, result(case="builtin-old"), "a")
    results.merge(tmp_path, "0.30.0")
    results.append(tmp_path, dataclasses.replace(result(case="offloader"), subject="example-offloader"), "b")
    results.merge(tmp_path, "0.30.0")
    results.append(tmp_path, result(case="builtin-new"), "c")
    results.merge(tmp_path, "0.30.0")
    assert sorted((r.subject, r.case) for r in results.read(tmp_path)) == [
        ("builtin", "builtin-new"), ("example-offloader", "offloader")]


def run_of(root, run, *lines):
    """A run's lines, written to its worker file and merged as its controller does; what the merge did."""
    for x in lines:
        results.append(root, dataclasses.replace(x, run=run), f"{run}-gw0")
    return results.merge(root, "0.30.0", f"{run}-")


def test_a_narrower_re_run_replaces_what_it_re_ran_and_keeps_the_rest(tmp_path):
    split, bit = dict(check="split-agrees"), dict(check="bit-identity")
    whole = dict(geometry="*", sparsity="*")
    old = run_of(tmp_path, "Y", result(case="a", **split), result(case="b", **split),
                 result(geometry="kv-first:KV.B.H.N.D", case="c", **split), result(case="d", **bit),
                 result(case="e", **bit), result(check="contracts", **whole), result(check="drift", **whole),
                 result(outcome="stale", known="builtin#1", check="split-agrees", geometry="kv-first:*", sparsity="*"),
                 result(outcome="stale", known="builtin#2", check="bit-identity", geometry="packed:*", sparsity="*"))
    assert str(old) == "0.30.0: 9 lines of run Y added"
    new = run_of(tmp_path, "X", result(case="f", **split), result(geometry="kv-first:KV.B.H.N.D", case="g", **split),
                 result(check="contracts", **whole))
    # The split items, the contracts line and the stale finding that covers split-agrees on kv-first were re-checked.
    assert (new.added, new.replaced, new.kept) == ((("X", 3),), (("Y", 5),), (("Y", 4),))
    assert str(new) == "0.30.0: 3 lines of run X replaced 5 of run Y; 4 lines of run Y kept (not re-checked)"
    assert sorted((r.run, r.check, r.case or r.known) for r in results.read(tmp_path)) == [
        ("X", "contracts", ""), ("X", "split-agrees", "f"), ("X", "split-agrees", "g"),
        ("Y", "bit-identity", "builtin#2"), ("Y", "bit-identity", "d"), ("Y", "bit-identity", "e"),
        ("Y", "drift", "")]


def test_an_unexercised_line_goes_when_a_later_run_checks_an_item_its_finding_covers(tmp_path):
    fp8 = dict(check="split-agrees", geometry="packed:B.H.N.C@fp8_e4m3")
    mark = dict(known="builtin#1", check="split-agrees", geometry="*@fp8_e4m3", sparsity="*")
    run_of(tmp_path, "Y", result(outcome="unsupported", case="a", **fp8), result(outcome="unexercised", **mark))
    run_of(tmp_path, "X", result(case="b", check="split-agrees"))  # covers nothing of the finding: the line stays
    assert ("Y", "unexercised") in {(r.run, r.outcome) for r in results.read(tmp_path)}
    # Re-checked: gone, whatever that run says of the finding (its own line, stale or unexercised, replaces it).
    assert str(run_of(tmp_path, "Z", result(case="c", **fp8))) == (
        "0.30.0: 1 line of run Z replaced 2 of run Y; 1 line of run X kept (not re-checked)")
    run_of(tmp_path, "W", result(outcome="unexercised", **mark))  # one finding's lines are one item: replaced alike
    merged = run_of(tmp_path, "V", result(outcome="stale", **mark))
    assert merged.replaced == (("W", 1),)
    assert "unexercised" not in {r.outcome for r in results.read(tmp_path)}


def test_unexercised_is_no_outcome_a_known_finding_can_predict():
    assert "unexercised" not in results.OUTCOMES and "stale" not in results.OUTCOMES
    assert not results.Word.UNEXERCISED.passing
    assert set(results.NOT_RAN) < set(results.OUTCOMES)


@pytest.mark.parametrize("other", [dict(backends=("FLASHINFER",)), dict(cache_dtype="fp8_e4m3"),
                                   dict(sparsity="nm-2:4"), dict(geometry="*"), dict(check="determinism"),
                                   dict(subject="offloader")])
def test_a_line_replaces_only_lines_of_its_own_item(tmp_path, other):
    run_of(tmp_path, "Y", result(case="a", backends=("FLASH_ATTN",), cache_dtype="auto"))
    merged = run_of(tmp_path, "X", result(case="b", **{"backends": ("FLASH_ATTN",), "cache_dtype": "auto", **other}))
    assert str(merged) == "0.30.0: 1 line of run X added; 1 line of run Y kept (not re-checked)"
    merged = run_of(tmp_path, "Z", result(case="c", backends=("FLASH_ATTN",), cache_dtype="auto"))
    assert str(merged) == "0.30.0: 1 line of run Z replaced 1 of run Y; 1 line of run X kept (not re-checked)"
    assert sorted(r.case for r in results.read(tmp_path)) == ["b", "c"]


def test_a_merge_of_nothing_says_so_and_changes_nothing(tmp_path):
    run_of(tmp_path, "Y", result(case="a"))
    before = (tmp_path / "0.30.0" / "results.jsonl").read_text()
    merged = results.merge(tmp_path, "0.30.0", "X-")
    assert str(merged) == f"0.30.0: no new lines ({tmp_path / '0.30.0' / 'results.jsonl'} unchanged)"
    assert (tmp_path / "0.30.0" / "results.jsonl").read_text() == before
