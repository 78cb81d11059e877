"""A known finding none of whose examples ran (every one unsupported, not run, skipped or not applicable, or its check
deselected) is `unexercised`, never silently green: one line per release of the run, in the run's summary, the
report's verdict and its own section. A finding some of whose examples ran and that did not happen stays `stale`."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import recorded

from harness import results
from harness.contract import Contract
from harness.handed.layer import kv_views
from harness.recordings.store import save
from harness.results import STALE, UNEXERCISED, Word, findings
from harness.run.releases import ReleaseContracts
from harness.run.sink import Sink

REPO = Path(__file__).resolve().parent.parent
PACKED = Contract.of(("B", "H", "N", "C"), ("B", "H", "N", "C"), "vllm 0.33.0 FLASH_ATTN LBHNC single-layer")
FP8 = Contract.of(("B", "H", "N", "C"), ("B", "N", "H", "C"), "vllm 0.33.0 TRITON_ATTN LBNHC single-layer", "fp8_e4m3")
RELEASE = ReleaseContracts("0.33.0", "replay", (PACKED, FP8))
ENTRY = ('[[finding]]\nreleases = "{releases}"\ngeometry = "{geometry}"\nsparsity = "*"\ncheck = "{check}"\n'
         'outcome = "differs"\nreason = "reads the scale as data"\nlink = "here"\n')


def marked(tmp_path: Path, lines: list[tuple[str, str, Word, str]], releases: str = "*",
           geometry: str = "*@fp8_e4m3", check: str = "split-agrees",
           known: str = "") -> tuple[list[results.Result], list[str]]:
    """The stale and unexercised lines a run of `lines` (geometry, check, word, diagnosis) over RELEASE marks for one
    known finding (`known`: the finding's id on the lines it predicted), and the run's summary."""
    (tmp_path / "known").mkdir()
    (tmp_path / "known" / "subj.toml").write_text(ENTRY.format(releases=releases, geometry=geometry, check=check))
    sink = Sink(tmp_path / "results", "run1", "run1-main", "subj", findings.load("subj", tmp_path / "known"))
    for g, c, word, diagnosis in lines:
        sink.write(RELEASE, g, c, "*" if g == "*" else "none", word, diagnosis,
                   known=known if word == Word.DIFFERS else "")
    sink.merge([RELEASE])
    lines = [x for x in results.read(tmp_path / "results", "0.33.0") if x.outcome in (STALE, UNEXERCISED)]
    return lines, sink.summary([RELEASE], [], [])


def test_only_unsupported_examples_leave_it_unexercised_saying_what_they_were(tmp_path):
    lines = [(FP8.name, "split-agrees", Word.UNSUPPORTED, "fp8 caches are not read")] * 3
    lines += [(PACKED.name, "split-agrees", Word.BIT_IDENTICAL, "")]  # outside its glob
    [line], summary = marked(tmp_path, lines)
    assert (line.outcome, line.known, line.geometry) == (UNEXERCISED, "subj#1", "*@fp8_e4m3")
    assert line.diagnosis == ("known finding subj#1 (differs: reads the scale as data) not exercised, none of its "
                              "examples ran: 3 unsupported (first: fp8 caches are not read)")
    assert f"  UNEXERCISED subj#1: {line.diagnosis}" in summary


def test_only_not_run_examples_leave_it_unexercised_not_stale(tmp_path):
    [line], _ = marked(tmp_path, [(FP8.name, "split-agrees", Word.NOT_RUN, "the split reads other elements"),
                                  (FP8.name, "split-agrees", Word.SKIPPED, "")])
    assert line.outcome == UNEXERCISED
    assert line.diagnosis.endswith("ran: 1 not-run (first: the split reads other elements), 1 skipped")


def test_examples_that_ran_without_it_happening_make_it_stale(tmp_path):
    [line], summary = marked(tmp_path, [(FP8.name, "split-agrees", Word.BIT_IDENTICAL, ""),
                                        (FP8.name, "split-agrees", Word.UNSUPPORTED, "not this one")])
    assert line.outcome == STALE and line.diagnosis.endswith("applied but did not happen")
    assert f"  STALE subj#1: {line.diagnosis}" in summary


def test_a_finding_that_happened_is_neither(tmp_path):
    assert marked(tmp_path, [(FP8.name, "split-agrees", Word.DIFFERS, "planted")], known="subj#1")[0] == []


@pytest.mark.parametrize("releases, geometry", [("<0.30", "*@fp8_e4m3"), ("*", "blocks-first:*")])
def test_nothing_is_said_of_a_release_out_of_its_range_or_with_no_geometry_it_names(tmp_path, releases, geometry):
    # blocks-first: the glob matches none of the release's contracts, so the finding says nothing about the release.
    lines = [(FP8.name, "split-agrees", Word.UNSUPPORTED, "fp8 caches are not read")]
    assert marked(tmp_path, lines, releases=releases, geometry=geometry)[0] == []


def test_a_deselected_check_leaves_it_unexercised(tmp_path):
    [line], _ = marked(tmp_path, [(FP8.name, "split-agrees", Word.BIT_IDENTICAL, "")], check="determinism")
    assert line.outcome == UNEXERCISED and line.check == "determinism"
    assert line.diagnosis.endswith("none of its examples ran: no item of check determinism selected in this run")


def test_a_check_not_applicable_to_the_subject_leaves_it_unexercised(tmp_path):
    # A not-applicable line is one per release and check (geometry "*"): it speaks of the finding's geometries too.
    lines = [("*", "bit-identity", Word.NOT_APPLICABLE, "needs forwards")]
    [line], summary = marked(tmp_path, lines, check="bit-identity")
    assert line.outcome == UNEXERCISED and line.diagnosis.endswith("ran: 1 not-applicable (first: needs forwards)")
    # The release reads as not run, and the finding it hid is said all the same.
    assert summary[1:] == ["kvconform 0.33.0 (replay) subj: not run (this run checked nothing of it; 1 not-applicable)",
                           f"  UNEXERCISED subj#1: {line.diagnosis}"]


class RefusesFp8:
    """A KV-cache consumer that reads model-dtype caches only: it refuses every fp8 layer."""

    name = "refuses-fp8"
    capabilities = frozenset({"split"})

    def supports_layer(self, layer):
        return f"{layer.cache_dtype} caches are not read" if layer.cache_dtype.startswith("fp8") else None

    def split(self, kv_cache, layer):
        return kv_views(kv_cache, layer)


def test_a_refusal_over_a_known_findings_geometry_is_listed_unexercised(tmp_path):
    names = ["packed:B.H.N.C", "packed:B.H.N.C@fp8_e4m3"]
    save(recorded.cut("0.33.0", recorded.geometries("0.33.0", names)), tmp_path / "contracts")
    (tmp_path / "known").mkdir()
    (tmp_path / "known" / f"{RefusesFp8.name}.toml").write_text(
        ENTRY.format(releases="*", geometry="*@fp8_e4m3", check="split-agrees"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--hypothesis-profile=kvconform-ci",
           "conformance/test_split.py", "-k", "split_agrees", "--kvconform-release=0.33.0",
           "--kvconform-max-examples=2", "--kvconform-subject=test_unexercised:RefusesFp8",
           f"--kvconform-contracts-dir={tmp_path / 'contracts'}", f"--kvconform-results-dir={tmp_path / 'results'}",
           f"--kvconform-regressions-dir={tmp_path / 'regressions'}",
           f"--kvconform-known-findings={tmp_path / 'known'}"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]  # never red: the finding is known, only not exercised
    said = re.search(r"^  UNEXERCISED refuses-fp8#1: (.*)$", out, re.M)
    assert said, out[-4000:]
    assert re.fullmatch(r"known finding refuses-fp8#1 \(differs: reads the scale as data\) not exercised, none of its "
                        r"examples ran: \d+ unsupported \(first: fp8_e4m3 caches are not read\)", said.group(1))
    report = subprocess.run([sys.executable, "-m", "harness.report", str(tmp_path / "results")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "GREEN: no new findings in 1 release; 1 unexercised known finding" in report.stdout
    md = (tmp_path / "results" / "report.md").read_text()
    section = md.split("## Unexercised known findings", 1)[1].split("\n## ", 1)[0]
    assert f"- refuses-fp8#1: split-agrees on 0.33.0: {said.group(1)}" in section
    assert "refuses-fp8#1" in (tmp_path / "results" / "report.html").read_text().split('id="unexercised"')[1]
