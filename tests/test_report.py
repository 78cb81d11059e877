"""The report says what broke first (verdict, what changed since the last report, new findings with REPRO lines, the
failures only one release has) and never merges outcome words: a cell reads passed/total with every other word
counted beside it, red with any new finding; a known finding never hides a new one. Every report here is built from
hand-written result lines."""

import ast
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import fields
from pathlib import Path

import pytest

from harness import report, results
from harness.matrix.build import PYPI, Build
from harness.report import cells, schema, sections
from harness.report.__main__ import main
from harness.report.fold import report_data, span
from harness.report.html import report_html
from harness.report.markdown import report_md
from harness.report.schema import ApiRelease, Provenance, RunLines, Unsupported
from harness.recordings.api_history import ApiChange
from harness.results import OUTCOMES, PASSING, Result


def add(root, release, geometry, outcome, check="bit-identity", known="", source="replay", diagnosis="", repro="",
        backends=(), subject="builtin"):
    """One line as a run writes it: a geometry named `family:order[@cache dtype]` carries those fields."""
    family, _, rest = geometry.partition(":")
    order, _, dtype = rest.partition("@")
    where = dict(family=family, order=order, cache_dtype=dtype or "auto", backends=backends) if rest else {}
    results.append(root, Result(run="r1", release=release, source=source, subject=subject, geometry=geometry,
                                check=check, sparsity="none", outcome=outcome, case="c", diagnosis=diagnosis,
                                known=known, repro=repro, **where), "w")


def merged(root):
    """Merge each release's worker file into results.jsonl, as a session does when it ends (once: a merge replaces
    the release's previous results)."""
    for d in root.iterdir():
        results.merge(root, d.name)
    return root


def build(tmp_path):
    root = tmp_path / "results"
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "bit-identical")
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "differs", diagnosis="1 of 8 differ", repro="REPRO differs 0.9.2")
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "unsupported", diagnosis="head_dim 80")
    add(root, "0.30.0", "kv-first:KV.B.N.H.D", "contract-error", known="builtin#1")
    add(root, "0.30.0", "kv-first:KV.B.N.H.D", "harness-error", diagnosis="KeyError: 'x'", repro="REPRO harness 0.30.0")
    add(root, "0.30.0", "kv-first:KV.B.N.H.D", "stale", check="split-agrees", known="builtin#2")
    add(root, "0.8.5.post1", "*", "install-error", check="install", source="install", diagnosis="uv failed")
    add(root, "main", "packed:B.H.N.C", "skipped", check="vllm-write")
    return root


def fold(root):
    return report_data(results.read(merged(root)))


def matrix_rows(md: str, subject: str = "builtin") -> dict[str, list[str]]:
    """The first-screen matrix of `subject` as {release: [cell, ...]} (the columns after `contracts from`)."""
    table = md.split(f"### {subject}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return {cells[0]: cells[2:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in table[2:])}


def test_matrix_keeps_every_outcome_word_apart(tmp_path):
    data = fold(build(tmp_path))
    assert data.releases == ("0.8.5.post1", "0.9.2", "0.30.0", "main")
    cell = data.matrix["builtin"]["0.9.2"]["blocks-first:B.KV.N.H.D"]
    assert cell == {"differs": 1, "unsupported": 1, "bit-identical": 1}  # worst first
    cell = data.matrix["builtin"]["0.30.0"]["kv-first:KV.B.N.H.D"]
    assert cell == {"harness-error": 1, "contract-error [known]": 1, "stale": 1}
    assert data.matrix["builtin"]["0.8.5.post1"]["*"] == {"install-error": 1}
    assert data.matrix["builtin"]["main"]["packed:B.H.N.C"] == {"skipped": 1}
    assert data.checks["builtin"]["0.30.0"]["bit-identity"] == {"harness-error": 1, "contract-error [known]": 1}


def test_new_known_and_stale_findings_are_listed_apart(tmp_path):
    data = fold(build(tmp_path))
    assert sorted(r.outcome for r in data.new_findings) == ["differs", "harness-error", "install-error"]
    assert [k.id for k in data.known_findings] == ["builtin#1"]
    assert [s.known for s in data.stale_findings] == ["builtin#2"]
    assert data.unsupported == (Unsupported("builtin", "head_dim 80", 1),)


def test_verdict_counts_new_findings_and_their_releases(tmp_path):
    assert fold(build(tmp_path)).verdict == "RED: 3 new findings in 3 releases"
    root = tmp_path / "green"
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical")
    add(root, "0.33.0", "packed:B.H.N.C", "contract-error", known="builtin#1")  # known: reported, still green
    add(root, "0.33.0", "*", "stale", check="split-agrees", known="builtin#2")
    add(root, "0.28.0", "packed:B.H.N.C", "skipped", check="vllm-write")
    assert fold(root).verdict == "GREEN: no new findings in 1 release; nothing checked in 0.28.0 (only skipped)"
    add(root, "0.28.0", "packed:B.H.N.C", "accepted", check="rejects-malformed")
    assert fold(root).verdict == "RED: 1 new finding in 1 release"


@pytest.mark.parametrize("counts, face, beside", [
    ({"bit-identical": 70, "rejected": 50}, "120/120", ""),
    ({"bit-identical": 70, "rejected": 50, "skipped": 1}, "120/121", "○1"),
    ({"within-tolerance": 9, "stale": 1}, "9/10", "◌1"),
    ({"skipped": 3, "not-run": 2}, "–2", "○3"),  # nothing passed: the worst mark is the face
    ({"bit-identical": 40, "unsupported": 180}, "40/220", "⊘180"),  # never "⊘180" when something passed
    ({"bit-identical": 5, "contract-error [known]": 2}, "5/7", "◆2"),
    ({"contract-error [known]": 2, "differs": 1}, "✗1", "◆2"),
    ({"differs": 4, "accepted": 1, "subject-error": 2, "harness-error": 1}, "!3", "✗5"),
])
def test_a_cell_reads_passed_of_total_and_counts_the_other_words_beside_it(counts, face, beside):
    c = cells.cell(counts)
    assert c.face == face and " ".join(f"{m.glyph}{n}" for m, n in c.beside) == beside
    assert c.total == sum(counts.values())


def test_pass_over_total_per_cell_from_known_lines(tmp_path):
    root = tmp_path / "results"
    for _ in range(3):
        add(root, "0.25.1", "packed:B.H.N.C", "bit-identical")
    add(root, "0.25.1", "packed:B.H.N.C@nvfp4", "unsupported", diagnosis="nvfp4")
    add(root, "0.25.1", "packed:B.H.N.C", "contract-error", known="builtin#1")
    add(root, "0.25.1", "*", "skipped", check="vllm-write")
    add(root, "0.33.0", "packed:B.H.N.C", "rejected", check="rejects-malformed")
    data = fold(root)
    rows = matrix_rows(report_md(data))
    assert rows["0.25.1"] == ["·", "3/5 ◆1 ⊘1", "○1"] and rows["0.33.0"] == ["1/1", "·", "·"]
    c = cells.cell(data.checks["builtin"]["0.25.1"]["bit-identity"])
    assert (c.passed, c.total, c.red, c.tone) == (3, 5, False, "f6")
    assert cells.cell(data.checks["builtin"]["0.33.0"]["rejects-malformed"]).tone == "f10"
    dtypes = report_md(data).split("#### builtin: release × cache dtype")[1].splitlines()
    assert "| 0.25.1 | 3/4 ◆1 | ⊘1 |" in dtypes  # auto: the passes and the known finding; nvfp4: unsupported


def test_one_planted_failure_among_passes_makes_a_red_cell(tmp_path):
    root = tmp_path / "results"
    for _ in range(99):
        add(root, "0.33.0", "packed:B.H.N.C", "bit-identical")
    add(root, "0.33.0", "packed:B.H.N.C", "differs", diagnosis="1 of 8 differ", repro="REPRO planted")
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", check="determinism")
    data = fold(root)
    c = cells.cell(data.checks["builtin"]["0.33.0"]["bit-identity"])
    assert (c.face, c.red, c.tone) == ("99/100", True, "red")
    assert matrix_rows(report_md(data))["0.33.0"] == ["**99/100** **✗1**", "1/1"]
    tree = ET.fromstring(report_html(data))
    tds = [td for td in tree.iter("td") if td.get("data-check")]
    assert [(td.get("data-check"), td.get("class")) for td in tds] == [
        ("bit-identity", "cell c red"), ("determinism", "cell c f10")]
    assert "".join(tds[0].itertext()) == "99/100 ✗1"


def test_only_passing_words_get_the_pass_mark():
    for word in OUTCOMES:
        assert (cells.mark(word) is cells.PASS) == (word in PASSING), word
        assert cells.mark(f"{word} [known]") is cells.KNOWN
        assert (cells.outcome_class(word) == "pass") == (word in PASSING), word
    assert {cells.mark(w) for w in OUTCOMES if w not in PASSING} >= {cells.ERROR, cells.FAIL, cells.SKIPPED}


def test_known_finding_never_hides_a_new_one(tmp_path):
    root = build(tmp_path)
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "contract-error", check="determinism", known="builtin#3")
    md = report_md(fold(root))
    columns = md.split("### builtin\n\n", 1)[1].splitlines()[0].strip("|").split("|")[2:]
    assert [c.strip() for c in columns] == ["install", "split-agrees", "bit-identity", "determinism", "vllm-write"]
    rows = matrix_rows(md)
    assert rows["0.30.0"][2] == "**!1** ◆1"  # harness-error beside a known contract-error
    assert rows["0.9.2"][2:4] == ["**1/3** **✗1** ⊘1", "◆1"]  # a known finding alone is a known mark
    assert rows["0.30.0"][1] == "◌1" and rows["0.8.5.post1"][0] == "**!1**" and rows["main"][4] == "○1"
    assert rows["main"][:4] == ["·"] * 4


def test_new_findings_come_first_grouped_with_their_repro_lines(tmp_path):
    root = build(tmp_path)
    for release, geometry, case in (("0.30.0", "packed:B.H.N.C", 1), ("0.30.0", "packed:B.H.N.C", 1),
                                    ("0.30.0", "packed:B.H.N.C", 2), ("main", "packed:B.H.N.C", 3),
                                    ("main", "packed:B.N.H.C", 4)):
        add(root, release, geometry, "differs", diagnosis=f"{case} of 64 differ, max ULP {case}",
            repro=f"REPRO bit-identity case {case}")
    md = report_md(fold(root))
    head, matrix = md.split("## What broke")[0], md.index("## Where")
    # one finding per release and geometry: 0.30.0's three failing examples differ only in their numbers
    assert head.splitlines()[2] == "**RED: 6 new findings in 4 releases**"
    broke = md[md.index("## What broke"):matrix]
    # worst first (errors before value differences); the same diagnosis up to its numbers is one kind of finding
    assert [m.group(1) for m in re.finditer(r"^- \*\*(.+?)\*\*", broke, re.M)] == [
        "! harness-error", "! install-error", "✗ differs", "✗ differs"]
    kind = next(k for k in broke.split("\n- ") if "of 64 differ" in k)
    assert "· bit-identity · 0.30.0, main · packed:B.H.N.C, packed:B.N.H.C · 3 findings (5 result lines)" in kind
    assert "2 of 64 differ, max ULP 2" in kind and "of 8 differ" not in kind  # another diagnosis, another kind
    assert "REPRO bit-identity case 1" not in broke  # a finding's newest REPRO line stands for it
    shown = sections.REPROS_SHOWN
    assert sum(f"REPRO bit-identity case {c}" in broke for c in range(2, 5)) == shown
    assert f"+{3 - shown} more REPRO lines" in broke
    assert "REPRO harness 0.30.0" in broke and "REPRO differs 0.9.2" in broke
    assert md.index("uv failed") < matrix  # a finding without REPRO line still says why


def test_kinds_beyond_the_first_screen_are_under_details(tmp_path, monkeypatch):
    monkeypatch.setattr(sections, "FIRST_GROUPS", 1)
    md = report_md(fold(build(tmp_path)))
    assert "+2 more kinds of new finding: under Details" in md
    details = md[md.index("## Details"):]
    assert "REPRO differs 0.9.2" in details and "REPRO harness 0.30.0" not in details


def test_outcome_words_fit_the_check(tmp_path):
    assert cells.says("drift", "bit-identical") == "no drift"
    assert cells.says("drift", "differs [known]") == "drift [known]"
    assert cells.says("bit-identity", "bit-identical") == "bit-identical"
    root = tmp_path / "results"
    add(root, "0.33.0", "*", "bit-identical", check="drift", source="live")
    add(root, "0.32.0", "*", "differs", check="drift", source="live", diagnosis="axes changed", repro="REPRO drift")
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", check="split-agrees")
    data = fold(root)
    assert data.checks["builtin"]["0.33.0"]["drift"] == {"bit-identical": 1}  # the stored word stays
    md = report_md(data)
    assert "- **✗ drift** · builtin · drift · 0.32.0 · whole release" in md
    details = md[md.index("## Details"):]
    assert "| 0.33.0 | no drift 1 | agrees 1 |" in details and "bit-identical" not in details


def test_html_is_well_formed_and_says_the_same(tmp_path):
    root = build(tmp_path)
    add(root, "main", "packed:B.H.N.C", "differs", diagnosis="x < y & z", repro="REPRO <b>1</b>")
    data = fold(root)
    html, md = report_html(data), report_md(data)
    tree = ET.fromstring(html)  # well-formed: parses as XML, every tag closed, every '<' and '&' escaped
    text = " ".join(" ".join(e.itertext()) for e in tree.iter())
    assert tree.find("head/title").text == f"kvconform: {data.verdict}"
    verdict = next(e for e in tree.iter("p") if "verdict" in e.get("class", ""))
    assert (verdict.text, verdict.get("class")) == ("RED: 4 new findings in 4 releases", "verdict red")
    broke = next(e for e in tree.iter("h2") if e.text.startswith("What broke"))
    pres = [e.text for e in tree.iter("pre")][:3]  # the new findings' (the drill-down rows' come after)
    assert pres == re.findall(r"^  (REPRO .*)$", md, re.M) == ["REPRO harness 0.30.0", "REPRO differs 0.9.2",
                                                               "REPRO <b>1</b>"]
    assert broke is not None and "x < y & z" in text and "uv failed" in text
    # the release x check matrix: the same faces and counts as the markdown, each coloured by its cell's tone
    table = tree.find(".//table[@id='m0']")
    rows = {tr[0].text: tr[2:] for tr in table.findall("tr")[1:]}
    for release, faces in matrix_rows(md).items():
        assert ["".join(td.itertext()) for td in rows[release]] == [c.replace("*", "") for c in faces]
    red = rows["0.30.0"][2]
    assert red.get("class") == "cell c red" and red.get("title") == "harness-error 1 · contract-error [known] 1"
    assert [td.get("class") for td in rows["main"]] == ["none", "none", "cell c red", "cell c skipped"]


def test_command_writes_markdown_html_and_json(tmp_path):
    root = merged(build(tmp_path))
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# kvconform conformance report\n\n**RED: 3 new findings in 3 releases**\n")
    row = r"\| 0\.9\.2 \| replay, run r1 at \S+ \| · \| · \| \*\*1/3\*\* \*\*✗1\*\* ⊘1 \| · \|"
    assert re.search(row, md), md
    assert ET.fromstring((tmp_path / "out" / "report.html").read_text()).tag == "html"
    data = schema.read(tmp_path / "out" / "report.json")
    assert data.releases[0] == "0.8.5.post1" and data.verdict.startswith("RED")


def test_release_spans_follow_the_report_order():
    releases = ["0.8.5.post1", "0.9.2", "0.10.2", "0.11.2", "0.33.0", "main"]
    assert span({"0.9.2", "0.11.2", "0.10.2", "main"}, releases) == "0.9.2–0.11.2, main"
    assert span(releases, releases) == "all 6 releases (0.8.5.post1–main)"


def test_no_results_is_an_error(tmp_path):
    assert main([str(tmp_path)]) == 1


def test_not_applicable_is_its_own_mark_never_a_pass_nor_a_finding(tmp_path):
    root = tmp_path / "results"
    add(root, "0.25.1", "blocks-first:B.KV.N.H.D", "bit-identical", check="split-agrees")
    add(root, "0.25.1", "*", "not-applicable", check="bit-identity", diagnosis="declares split; needs forward")
    add(root, "0.25.1", "blocks-first:B.KV.N.H.D", "unsupported", check="transfer", diagnosis="fp8 only")
    data = fold(root)
    assert data.verdict.startswith("GREEN") and not data.new_findings
    assert data.checks["builtin"]["0.25.1"]["bit-identity"] == {"not-applicable": 1}
    assert cells.mark("not-applicable") not in (cells.PASS, cells.UNSUPPORTED, cells.SKIPPED)
    row = matrix_rows(report_md(data))["0.25.1"]
    assert row == ["1/1", "⊘1", "∅1"]  # split-agrees, transfer, bit-identity in the reader's order
    assert "not-applicable" in report_html(data)


def test_cache_dtypes_get_their_own_matrix_and_geometries_name_their_backends(tmp_path):
    root = tmp_path / "results"
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN", "PLANTED"))
    add(root, "0.33.0", "packed:B.N.H.C@fp8_e4m3", "differs", diagnosis="1 of 8 differ", repro="REPRO fp8")
    add(root, "0.33.0", "head-slots:B.S.N.D@nvfp4", "unsupported", diagnosis="cache dtype nvfp4 not supported")
    data = report_data(results.read(merged(root)))
    assert {d: dict(c) for d, c in data.cache_dtypes["builtin"]["0.33.0"].items()} == {
        "auto": {"bit-identical": 1}, "fp8_e4m3": {"differs": 1}, "nvfp4": {"unsupported": 1}}
    md = report_md(data)
    table = md[md.index("#### builtin: release × cache dtype"):].splitlines()
    assert table[2] == "| release | auto | fp8_e4m3 | nvfp4 |"
    assert re.match(r"\| 0\.33\.0 \| \S+ \| \S+ \| \S+ \|", table[4])
    assert sections.family(data, "packed:B.N.H.C@fp8_e4m3") == "packed@fp8_e4m3"
    # The backends are the run's (its lines), not the shipped recordings', which have no PLANTED backend.
    backends = md[md.index("## Backends"):].splitlines()
    assert "- PLANTED: 0.33.0 · packed:B.H.N.C" in backends, backends
    assert "release × cache dtype" in report_html(data)


WHEEL_0330 = Build("0.33.0", "5f0c2b1de", "vllm-0.33.0-cp38-abi3-linux_x86_64.whl", PYPI)


def test_the_report_names_the_run_each_release_comes_from(tmp_path):
    root = tmp_path / "results"
    results.append(root, Result(release="0.25.1", source="replay", subject="builtin", geometry="g",
                                check="bit-identity", outcome="bit-identical", run="20261201T090000Z-aaaaaa"), "w")
    results.append(root, Result(release="0.33.0", source="live", subject="builtin", geometry="g",
                                check="bit-identity", outcome="bit-identical", run="20261201T100000Z-bbbbbb",
                                time="2026-12-01T10:02:03+00:00", build=WHEEL_0330), "w")
    data = fold(root)
    assert [r.run for r in data.origins["builtin"]["0.25.1"].runs] == ["20261201T090000Z-aaaaaa"]
    assert data.origins["builtin"]["0.33.0"] == Provenance(("live",), (WHEEL_0330,), (
        RunLines("20261201T100000Z-bbbbbb", "2026-12-01T10:02:03+00:00", 1),))
    md = report_md(data)
    assert ("| 0.33.0 | live of vllm 0.33.0 (5f0c2b1de) vllm-0.33.0-cp38-abi3-linux_x86_64.whl from "
            "https://pypi.org/simple, run 20261201T100000Z-bbbbbb at 2026-12-01T10:02:03+00:00 |") in md, md
    assert "run 20261201T090000Z-aaaaaa at 20" in md  # the time append() stamped


def test_a_timeout_is_an_error_in_the_report_never_a_pass(tmp_path):
    root = tmp_path / "results"
    add(root, "0.25.1", "g", "timeout", diagnosis="timeout: item ran past its limit of 600 s")
    data = fold(root)
    assert data.verdict.startswith("RED") and cells.mark("timeout") is cells.ERROR


def two_runs(tmp_path):
    """A previous run and the next, as their report.json files: between them 0.33.0's packed bit-identity on
    FLASH_ATTN breaks (a planted new failure) and 0.25.1's blocks-first determinism is fixed (a planted fix); the
    rest is the same."""
    def run(name, broken, fixed):
        root = tmp_path / name
        add(root, "0.25.1", "blocks-first:B.KV.N.H.D", "bit-identical", backends=("FLASH_ATTN",))
        add(root, "0.25.1", "blocks-first:B.KV.N.H.D", "bit-identical" if fixed else "differs", check="determinism",
            backends=("FLASH_ATTN",), diagnosis="run 2 differs", repro="REPRO determinism 0.25.1")
        add(root, "0.33.0", "packed:B.H.N.C", "differs" if broken else "bit-identical", backends=("FLASH_ATTN",),
            diagnosis="1 of 8 differ", repro="REPRO bit-identity 0.33.0")
        add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", check="determinism", backends=("FLASH_ATTN",))
        add(root, "0.33.0", "packed:B.H.N.C@nvfp4", "unsupported", backends=("FLASHINFER",), diagnosis="nvfp4")
        assert main([str(merged(root)), "--out", str(tmp_path / f"{name}-report")]) == 0
        return root
    return run("old", broken=False, fixed=False), run("new", broken=True, fixed=True)


def test_since_lists_exactly_a_planted_new_failure_and_a_planted_fix(tmp_path):
    _, new = two_runs(tmp_path)
    old_json = tmp_path / "old-report" / "report.json"
    data = report_data(results.read(new), since=[old_json])
    ch = data.changes
    assert [(c.release, c.check, c.geometry, c.backends, c.before, c.after, c.repro)
            for c in ch.new_failures] == [
        ("0.33.0", "bit-identity", "packed:B.H.N.C", ("FLASH_ATTN",), "pass", "fail", "REPRO bit-identity 0.33.0")]
    assert [(c.release, c.check, c.geometry, c.before, c.after) for c in ch.fixes] == [
        ("0.25.1", "determinism", "blocks-first:B.KV.N.H.D", "fail", "pass")]
    assert not any(getattr(ch, f.name) for f in fields(ch) if f.name not in ("since", "since_verdict", "new_failures",
                                                                             "fixes"))
    # First on the page, right under the verdict and the runs it folded, in markdown and HTML alike.
    md = report_md(data)
    assert md.split("\n## ")[1].startswith("Runs folded (1)")
    head = md.split("\n## ")[2]
    assert head.startswith(f"Since {old_json} (RED: 1 new finding in 1 release)"), md
    assert "### **1 new failure**" in head and "### 1 fix" in head and "REPRO bit-identity 0.33.0" in head
    assert "builtin · 0.33.0 · bit-identity · packed:B.H.N.C · FLASH_ATTN: pass → fail" in head
    tree = ET.fromstring(report_html(data))
    h2 = [e.text for e in tree.iter("h2")]
    assert h2[0] == "Runs folded (1)" and h2[1].startswith("Since ") and h2[2].startswith("What broke")


def test_since_through_the_command_and_against_itself(tmp_path, capsys):
    _, new = two_runs(tmp_path)
    new_json = tmp_path / "new-report" / "report.json"
    assert main([str(new), "--out", str(tmp_path / "again"), "--since", str(new_json)]) == 0
    md = (tmp_path / "again" / "report.md").read_text()
    assert f"Since {new_json}: no changes." in md and "## Since" not in md


def test_since_names_appeared_and_vanished_geometries_and_backends_and_gone_stale(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    add(old, "0.33.0", "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN", "XFORMERS"))
    add(old, "0.32.0", "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN",))
    add(new, "0.33.0", "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN",))
    add(new, "0.33.0", "packed:B.N.H.C", "bit-identical", backends=("FLASH_ATTN",))
    add(new, "0.33.0", "*", "stale", check="split-agrees", known="builtin#2")
    assert main([str(merged(old)), "--out", str(tmp_path / "o")]) == 0
    ch = report_data(results.read(merged(new)), since=[tmp_path / "o" / "report.json"]).changes
    assert ch.releases_vanished == ("0.32.0",) and not ch.releases_appeared
    assert [(p.release, p.name) for p in ch.geometries_appeared] == [("0.33.0", "packed:B.N.H.C")]
    assert [(p.release, p.name) for p in ch.backends_vanished] == [("0.33.0", "XFORMERS")]
    assert [p.name for p in ch.gone_stale] == ["builtin#2 (split-agrees)"]
    assert not ch.new_failures and not ch.fixes and not ch.geometries_vanished


UNEXERCISED_SAID = ("known finding builtin#3 (differs: reads the scale as data) not exercised, none of its examples "
                    "ran: 1 unsupported (first: fp8 caches are not read)")


def unexercised_run(root, releases=("0.33.0",)):
    """A GREEN run whose only fp8 example was refused over the geometry of a known finding, unexercised there."""
    for release in releases:
        add(root, release, "packed:B.H.N.C", "bit-identical", check="split-agrees")
        add(root, release, "packed:B.H.N.C@fp8_e4m3", "unsupported", check="split-agrees",
            diagnosis="fp8 caches are not read")
        add(root, release, "*@fp8_e4m3", "unexercised", check="split-agrees", known="builtin#3",
            diagnosis=UNEXERCISED_SAID)
    return root


def test_unexercised_findings_are_counted_in_the_verdict_and_listed_in_their_own_section(tmp_path):
    root = tmp_path / "results"
    data = fold(unexercised_run(root, ("0.32.0", "0.33.0")))
    # Never red, never a plain GREEN: the count says a known finding was not checked; one finding in two releases.
    assert data.verdict == "GREEN: no new findings in 2 releases; 1 unexercised known finding"
    assert [(u.known, u.release) for u in data.unexercised_findings] == [("builtin#3", "0.32.0"),
                                                                                 ("builtin#3", "0.33.0")]
    assert not data.new_findings and not data.known_findings and not data.stale_findings
    # No check's outcome: counted in its cell under its own mark, no key of its own, no class to any key.
    assert data.checks["builtin"]["0.33.0"]["split-agrees"] == {"unsupported": 1, "unexercised": 1,
                                                                   "bit-identical": 1}
    assert cells.cell({"unsupported": 1, "unexercised": 1, "bit-identical": 1}).face == "1/3"
    assert [m.glyph for m, _ in cells.cell({"unexercised": 1}).others] == ["◇"]
    assert not [k for k in data.keys if k[4] == "*@fp8_e4m3"]
    assert {k[6] for k in data.keys} == {"pass", "not run"}
    md, html = report_md(data), report_html(data)
    assert f"**{data.verdict}**" in md
    stale = md.split(f"## {sections.STALE_TITLE}\n\n", 1)[1].split("\n\n", 1)[0]
    assert stale == "none"
    listed = md.split(f"## {sections.UNEXERCISED_TITLE}\n\n", 1)[1].split("\n\n", 1)[0]
    assert listed == f"- builtin#3: split-agrees on all 2 releases (0.32.0–0.33.0): {UNEXERCISED_SAID}"
    tree = ET.fromstring(html)
    assert ["".join(li.itertext()) for li in tree.find(".//ul[@id='unexercised']")] == [listed[2:]]
    add(root, "0.33.0", "packed:B.H.N.C", "differs", check="bit-identity")
    assert fold(root).verdict == "RED: 1 new finding in 1 release; 1 unexercised known finding"


def test_with_no_unexercised_finding_the_verdict_says_nothing_of_them_and_the_section_none(tmp_path):
    root = tmp_path / "results"
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical")
    data = fold(root)
    assert data.verdict == "GREEN: no new findings in 1 release" and data.unexercised_findings == ()
    assert f"## {sections.UNEXERCISED_TITLE}\n\nnone\n" in report_md(data)
    tree = ET.fromstring(report_html(data))
    assert ["".join(li.itertext()) for li in tree.find(".//ul[@id='unexercised']")] == ["none"]


def test_since_names_known_findings_gone_unexercised(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    add(old, "0.33.0", "packed:B.H.N.C@fp8_e4m3", "differs", check="split-agrees", known="builtin#3")
    assert main([str(merged(old)), "--out", str(tmp_path / "o")]) == 0
    data = report_data(results.read(merged(unexercised_run(new))), since=[tmp_path / "o" / "report.json"])
    assert [(p.release, p.name) for p in data.changes.gone_unexercised] == [
        ("0.33.0", "builtin#3 (split-agrees)")]
    assert not data.changes.gone_stale and not data.changes.new_failures
    assert "### Known findings gone unexercised\n\n- builtin · builtin#3 (split-agrees) · 0.33.0" in report_md(data)


@pytest.mark.parametrize("content, says", [
    (None, "cannot read it"),
    ("{not json", "not a report.json (not JSON"),
    ('{"schema": 99, "keys": []}', "found schema 99"),
    ('{"releases": []}', "found schema none"),
])
def test_a_bad_since_file_is_an_error_naming_it(tmp_path, capsys, content, says):
    _, new = two_runs(tmp_path)
    bad = tmp_path / "previous" / "report.json"
    if content is not None:
        bad.parent.mkdir()
        bad.write_text(content)
    assert main([str(new), "--out", str(tmp_path / "x"), "--since", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--since {bad}: " in err and says in err, err
    assert not (tmp_path / "x").exists()


def test_a_result_line_of_another_schema_is_an_error_naming_its_file(tmp_path, capsys):
    line = tmp_path / "results" / "0.33.0" / "results.jsonl"
    line.parent.mkdir(parents=True)
    line.write_text(json.dumps({"release": "0.33.0", "outcome": "bit-identical"}) + "\n")
    assert main([str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"{line}:1: a result line of another kvconform (schema 1" in err, err


def test_release_specific_failures_are_found_for_a_planted_single_release_failure(tmp_path):
    root = tmp_path / "results"
    for release in ("0.22.1", "0.25.1", "0.28.0", "0.33.0"):
        add(root, release, "packed:B.H.N.C", "differs" if release == "0.28.0" else "bit-identical",
            backends=("FLASH_ATTN",), diagnosis="1 of 8 differ", repro=f"REPRO {release}")
        add(root, release, "packed:B.H.N.C", "bit-identical", check="determinism", backends=("FLASH_ATTN",))
        add(root, release, "kv-first:KV.B.N.H.D", "differs", backends=("FLASH_ATTN",))  # fails on every release
    add(root, "0.33.0", "packed:B.N.H.C@nvfp4", "unsupported", backends=("FLASH_ATTN",))  # not run: not "having" it
    data = fold(root)
    releases = [s for s in data.specific if s.dimension == "release"]
    assert [(s.where, s.check, dict(s.fixed), list(s.among)) for s in releases] == [
        ("0.28.0", "bit-identity", {"geometry": "packed:B.H.N.C", "backend": "FLASH_ATTN", "cache dtype": "auto"},
         ["0.22.1", "0.25.1", "0.28.0", "0.33.0"])]
    md = report_md(data)
    section = md.split("## **Only one release fails**\n\n", 1)[1].split("\n\n", 1)[0]
    assert section == ("- builtin · bit-identity · packed:B.H.N.C · FLASH_ATTN · auto: fail on 0.28.0 only, of "
                       "all 4 releases (0.22.1–0.33.0)")


def test_backend_and_cache_dtype_specific_failures(tmp_path):
    root = tmp_path / "results"
    add(root, "0.33.0", "blocks-first:B.KV.N.H.D", "bit-identical", backends=("FLASH_ATTN",))
    add(root, "0.33.0", "packed:B.H.N.C", "differs", backends=("FLASHINFER",))
    add(root, "0.33.0", "packed:B.H.N.C@fp8_e4m3", "bit-identical", backends=("FLASHINFER",))
    data = fold(root)
    found = {(s.dimension, s.where): dict(s.fixed) for s in data.specific}
    # FLASHINFER fails on a geometry FLASH_ATTN never ran: the geometry, not the backend, tells them apart
    assert found == {("cache dtype", "auto"): {"release": "0.33.0", "geometry": "packed:B.H.N.C",
                                               "backend": "FLASHINFER"}}


def test_a_live_runs_report_names_the_live_contracts_backends(tmp_path):
    root = tmp_path / "results"
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", source="live", backends=("FLASH_ATTN", "TRITON_ATTN"))
    add(root, "0.33.0", "packed:B.N.H.C@fp8_e4m3", "bit-identical", source="live", backends=("FLASHINFER",))
    add(root, "0.33.0", "*", "bit-identical", check="drift", source="live")
    data = fold(root)
    assert list(data.backends) == ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN"]
    md = report_md(data)
    assert "| 0.33.0 | live, run r1 at " in md
    backends = md.split("## Backends (as the folded result lines name them)\n\n", 1)[1].split("\n\n", 1)[0]
    assert backends.splitlines() == ["- FLASHINFER: 0.33.0 · packed:B.N.H.C@fp8_e4m3",
                                     "- FLASH_ATTN: 0.33.0 · packed:B.H.N.C",
                                     "- TRITON_ATTN: 0.33.0 · packed:B.H.N.C"]
    tree = ET.fromstring(report_html(data))
    rows = {tr.get("data-dtype"): tr.get("data-backends") for tr in tree.iter("tr") if tr.get("data-backends")}
    assert rows == {"auto": "FLASH_ATTN TRITON_ATTN", "fp8_e4m3": "FLASHINFER"}
    backend_filter = next(s for s in tree.iter("select") if s.get("id") == "f-backend")
    assert [o.get("value") for o in backend_filter] == ["", "FLASHINFER", "FLASH_ATTN", "TRITON_ATTN"]


def test_the_page_is_one_offline_file_with_a_drill_down_per_cell_and_filters(tmp_path):
    root = build(tmp_path)
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "differs", diagnosis="2 of 8 differ", repro="REPRO second",
        backends=("FLASH_ATTN",))
    data = fold(root)
    html = report_html(data)
    tree = ET.fromstring(html)
    assert not re.search(r"""(src|href)=|@import|url\(""", html)  # nothing fetched: it works offline
    assert {s.get("id") for s in tree.iter("select")} == {
        "f-subject", "f-release", "f-check", "f-backend", "f-dtype", "f-outcome"}
    script = "".join(next(tree.iter("script")).itertext())
    assert "URLSearchParams" in script and "addEventListener" in script
    # Every clickable cell names what its rows are filtered by, and those rows exist: one per geometry x backends x
    # cache dtype, with every word and count, and the REPRO lines.
    rows = [tr for tr in tree.iter("tr") if tr.get("data-subject")]
    for td in (td for td in tree.iter("td") if "c" in td.get("class", "").split()):
        mine = [tr for tr in rows if (tr.get("data-subject"), tr.get("data-release")) == (
            td.get("data-subject"), td.get("data-release")) and tr.get("data-check") == td.get("data-check", "")
            or tr.get("data-dtype") == td.get("data-dtype")]
        assert mine, td.attrib
    row = next(tr for tr in rows if tr.get("data-release") == "0.9.2" and tr.get("data-backends") == "")
    assert row.get("data-outcomes") == "differs|unsupported|bit-identical"
    assert "".join(row[6].itertext()) == "differs 1 · unsupported 1 · bit-identical 1"
    assert [p.text for p in row.iter("pre")] == ["REPRO differs 0.9.2"]
    other = next(tr for tr in rows if tr.get("data-backends") == "FLASH_ATTN")
    assert [p.text for p in other.iter("pre")] == ["REPRO second"]


# What `nox -s report` runs on nox's own interpreter: torch, hypothesis and numpy made unimportable, and every module
# the report imports checked to be the standard library's (tomli: harness.matrix's TOML parser on Python 3.10).
_BARE = """
import runpy, sys
for name in ("torch", "hypothesis", "numpy"):
    sys.modules[name] = None
before = set(sys.modules)
sys.argv = ["python -m harness.report", *sys.argv[1:]]
try:
    runpy.run_module("harness.report", run_name="__main__", alter_sys=True)
finally:
    allowed = {*sys.stdlib_module_names, "harness", *(("tomli",) if sys.version_info < (3, 11) else ())}
    extra = sorted({m.split(".")[0] for m in set(sys.modules) - before} - allowed)
    print("imported beyond the standard library:", extra, file=sys.stderr)
"""


def test_the_report_command_imports_only_the_standard_library(tmp_path):
    root = tmp_path / "results"
    add(root, "0.25.1", "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN",))
    add(root, "0.33.0", "packed:B.H.N.C", "differs", backends=("FLASH_ATTN",), diagnosis="1 of 8 differ")
    merged(root)
    repo = Path(report.__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _BARE, str(root)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    assert "imported beyond the standard library: []" in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert (root / "report.md").read_text().startswith("# kvconform conformance report\n\n**RED: 1 new finding")
    assert (root / "report.html").is_file() and json.loads((root / "report.json").read_text())["releases"] == [
        "0.25.1", "0.33.0"]


# harness.report's modules, each importing only the ones before it: no circle, nothing imported inside a function.
_LAYERS = ("cells", "keys", "lone_failures", "schema", "changes", "history", "fold", "sections", "markdown", "html",
           "connectors", "__main__")


def test_the_report_modules_import_one_way():
    package = Path(report.__file__).parent
    assert sorted(p.stem for p in package.glob("*.py")) == sorted((*_LAYERS, "__init__"))
    assert not ast.parse((package / "__init__.py").read_text()).body[1:]  # a docstring only
    for i, name in enumerate(_LAYERS):
        tree = ast.parse((package / f"{name}.py").read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert all(n in top for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))), name
        used = {f"{n.module}.{a.name}" if n.module == "harness.report" else n.module or ""
                for n in top if isinstance(n, ast.ImportFrom) for a in n.names}
        used |= {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        below = {f"harness.report.{m}" for m in _LAYERS[:i]}
        assert {u for u in used if u.startswith("harness.report")} <= below, name


def test_the_report_reads_its_values_by_field():
    """The report's values are typed (harness.report.schema): no module of the report looks one up by a string key, so
    a field renamed or removed is an error where it is read, not a KeyError on some report's page."""
    package = Path(report.__file__).parent
    found = [f"{p.name}:{n.lineno}: {ast.unparse(n)}" for p in sorted(package.glob("*.py"))
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)]
    assert found == []


def test_a_report_json_of_another_shape_is_refused_naming_the_field(tmp_path):
    root = build(tmp_path)
    folded = fold(root)
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert schema.read(tmp_path / "out" / "report.json") == folded  # what it holds reads back as it was folded
    cases = [(lambda d: d["runs"][0].update(lines="12"), "report.json.runs[0].lines: expected int, got str '12'"),
             (lambda d: d["new_findings"][0].pop("lines"), "report.json.new_findings[0]: missing fields ['lines'] of a "
                                                                  "ReportedFinding"),
             (lambda d: d["rows"][0].update(extra=1), "report.json.rows[0]: unknown fields ['extra']"),
             (lambda d: d["stale_findings"][0].update(outcome="fine"), "report.json.stale_findings[0].outcome: "
                                                                     "'fine' is no Word")]
    for spoil, said in cases:
        bad = json.loads(json.dumps(written))
        spoil(bad)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError) as e:
            schema.read(path)
        assert str(e.value).startswith(f"{path}: not a report.json of this kvconform: {said}"), str(e.value)


def run_of(root, run, time, release, *items, source="replay"):
    """A run's lines (check, geometry) of one release, written when `time` says and merged as its controller does."""
    for check, geometry in items:
        family, _, order = geometry.partition(":")
        results.append(root, Result(run=run, time=time, release=release, source=source, subject="builtin",
                                    check=check, geometry=geometry, sparsity="none", outcome="bit-identical",
                                    family=family if order else "", order=order, cache_dtype="auto" if order else "",
                                    backends=("FLASH_ATTN",) if order else ()), f"{run}-gw0")
    return results.merge(root, release, f"{run}-")


def older_and_partial(tmp_path):
    """An older live run of 0.22.1, an older complete replay run of 0.25.1, and a newer `-k split` re-run of 0.25.1."""
    root = tmp_path / "results"
    g1, g2 = "blocks-first:B.KV.N.H.D", "blocks-first:B.KV.H.N.D"
    run_of(root, "A", "2026-11-30T08:00:00+00:00", "0.22.1", ("contracts", "*"), ("drift", "*"),
           ("split-agrees", "kv-first:KV.B.N.H.D"), source="live")
    run_of(root, "Y", "2026-12-01T09:00:00+00:00", "0.25.1", ("contracts", "*"), ("split-agrees", g1),
           ("split-agrees", g2), ("bit-identity", g1), ("bit-identity", g1), ("bit-identity", g2), ("transfer", g1))
    merged = run_of(root, "X", "2026-12-02T10:00:00+00:00", "0.25.1", ("split-agrees", g1), ("split-agrees", g2))
    return root, merged


def test_a_partial_newer_run_beside_an_older_complete_one_is_named_in_the_verdict_and_the_runs(tmp_path):
    root, merged = older_and_partial(tmp_path)
    assert str(merged) == "0.25.1: 2 lines of run X replaced 2 of run Y; 5 lines of run Y kept (not re-checked)"
    data = fold(root)
    assert data.verdict == (
        "GREEN: no new findings in 2 releases — from 3 runs: run A (live, 0.22.1, 2026-11-30, 3 lines), "
        "run Y (replay, 0.25.1, 2026-12-01, partial: 5 of 7 lines), run X (replay, 0.25.1, 2026-12-02, partial: "
        "2 of 7 lines)")
    md = report_md(data)
    assert md.startswith(f"# kvconform conformance report\n\n**{data.verdict}**\n")
    runs = md.split("## Runs folded (3)\n\n", 1)[1].split("\n\n## ", 1)[0].split("\n\n")
    assert runs[0].splitlines() == [
        "| run | subject | contracts from | releases | lines | checks | written |", "|---|---|---|---|---|---|---|",
        "| A | builtin | live | 0.22.1 | 3 | contracts, drift, split-agrees | 2026-11-30T08:00:00+00:00 |",
        "| Y | builtin | replay | 0.25.1 | 5 of 7 (partial) | contracts, transfer, bit-identity | "
        "2026-12-01T09:00:00+00:00 |",
        "| X | builtin | replay | 0.25.1 | 2 of 7 (partial) | split-agrees | 2026-12-02T10:00:00+00:00 |"]
    assert runs[1] == sections.RUNS_NOTE
    rows = {r.split(" | ")[0]: r.split(" | ")[1] for r in md.split("### builtin\n\n", 1)[1].split("\n\n")[0]
            .splitlines()[2:]}
    assert rows == {"| 0.22.1": "live, run A at 2026-11-30T08:00:00+00:00",
                    "| 0.25.1": "replay, lines from 2 runs: run Y at 2026-12-01T09:00:00+00:00 (5 lines), run X at "
                                "2026-12-02T10:00:00+00:00 (2 lines)"}
    tree = ET.fromstring(report_html(data))
    table = tree.find(".//table[@id='runs']")
    assert [["".join(td.itertext()) for td in tr] for tr in table][3][:5] == [
        "X", "builtin", "replay", "0.25.1", "2 of 7 (partial)"]
    assert next(e for e in tree.iter("p") if "verdict" in e.get("class", "")).text == data.verdict


def test_many_runs_are_counted_in_the_verdict_and_listed_under_runs(tmp_path):
    root = tmp_path / "results"
    for n, release in enumerate(("0.22.1", "0.25.1", "0.28.0", "0.30.0", "0.33.0")):
        run_of(root, f"R{n}", f"2026-12-0{n + 1}T08:00:00+00:00", release, ("contracts", "*"))
    data = fold(root)
    assert data.verdict == "GREEN: no new findings in 5 releases — from 5 runs (0 partial): see Runs"
    assert [r.run for r in data.runs] == ["R0", "R1", "R2", "R3", "R4"]


def test_run_folds_only_the_named_runs_and_names_the_others(tmp_path, capsys):
    root, _ = older_and_partial(tmp_path)
    assert main([str(root), "--run", "X", "--run", "A", "--out", str(tmp_path / "out")]) == 0
    data = schema.read(tmp_path / "out" / "report.json")
    assert [r.run for r in data.runs] == ["A", "X"] and [r.run for r in data.left_out] == ["Y"]
    assert data.checks["builtin"]["0.25.1"] == {"split-agrees": {"bit-identical": 2}}
    assert data.verdict == ("GREEN: no new findings in 2 releases — from 2 runs: run A (live, 0.22.1, 2026-11-30, "
                               "3 lines), run X (replay, 0.25.1, 2026-12-02, 2 lines)")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "\nNot folded (no `--run` names them): run Y (replay, 0.25.1, 2026-12-01, 5 lines)\n" in md
    assert main([str(root), "--run", "Y", "--run", "nope", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err == f"python -m harness.report: --run nope: no such run under {root}; its runs: A, Y, X\n"
    assert not (tmp_path / "bad").exists()


def test_the_layout_api_changes_of_the_releases_covered_are_listed_and_none_means_no_section(tmp_path):
    root = tmp_path / "results"
    for release in ("0.28.0", "0.29.0"):
        add(root, release, "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN",))
    data = fold(root)
    assert [(a.release, a.before) for a in data.api_changes] == [("0.28.0", "0.27.1"), ("0.29.0", "0.28.0")]
    md = report_md(data)
    section = md.split(f"\n## {sections.API_TITLE}\n\n", 1)[1].split("\n\n## ", 1)[0].split("\n\n")
    assert section[0] == sections.API_NOTE
    lines = section[1].splitlines()
    assert lines[0] == ("- **0.28.0** (against 0.27.1): new: customize_spec (all 6 backends) · value: "
                        "FLASHINFER.supported_kv_cache_dtypes gains nvfp4_4over6")
    assert lines[1].startswith("- **0.29.0** (against 0.28.0): gone: vllm.v1.attention.backends.utils."
                               "get_kv_cache_layout, vllm.v1.attention.backends.utils.set_kv_cache_layout; "
                               "get_kv_cache_shape, get_kv_cache_stride_order, get_required_kv_cache_layout "
                               "(all 6 backends) · new: module vllm.v1.kv_cache_layout, ")
    assert md.index("## Where") < md.index(sections.API_TITLE) < md.index("## Known findings")
    tree = ET.fromstring(report_html(data))
    items = ["".join(li.itertext()) for li in tree.find(".//ul[@id='api']")]
    assert items == [line.removeprefix("- ").replace("**", "") for line in lines]
    unchanged = tmp_path / "unchanged"
    for release in ("0.30.0", "0.31.0"):  # the same layout API as the release before each
        add(unchanged, release, "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN",))
    data = fold(unchanged)
    assert data.api_changes == () and sections.API_TITLE not in report_md(data)
    assert sections.API_TITLE not in report_html(data)


def test_the_layout_api_section_reads_the_recordings_it_is_given(tmp_path):
    recordings = tmp_path / "recordings"
    recordings.mkdir()
    backend = {"present": True, "module": "m", "class": "C", "module_names": [], "answers": [],
               "members": {"get_kv_cache_shape": {"kind": "staticmethod", "signature": "(num_blocks: int)"}}}
    for release, signature in (("0.1.0", "(num_blocks: int)"), ("0.2.0", "(num_blocks: int, cache_dtype_str: str)")):
        api = {"format": 1, "modules": {}, "backends": {"B": {**backend, "members": {"get_kv_cache_shape": {
            "kind": "staticmethod", "signature": signature}}}}}
        (recordings / f"{release}.json").write_text(json.dumps({"release": release, "contracts": [], "api": api}))
    root = tmp_path / "results"
    add(root, "0.2.0", "packed:B.H.N.C", "bit-identical")
    data = report_data(results.read(merged(root)), recordings=recordings)
    assert data.api_changes == (ApiRelease("0.2.0", "0.1.0",
                                           {"signature": "B.get_kv_cache_shape gains cache_dtype_str: str"},
                                           (ApiChange("signature", "get_kv_cache_shape", ("B",),
                                                      "gains cache_dtype_str: str"),)),)
    assert "\n- **0.2.0** (against 0.1.0): signature: B.get_kv_cache_shape gains cache_dtype_str: str\n" in (
        report_md(data))
    (recordings / "0.1.0.json").write_text("{broken")
    with pytest.raises(ValueError, match=r"recordings/0\.1\.0\.json: not a recording: invalid JSON"):
        report_data(results.read(root), recordings=recordings)


def test_lines_of_two_subjects_get_a_verdict_each_and_subject_reports_one(tmp_path, capsys):
    # Two subjects' runs written into one results folder: the red one does not make the green one red.
    root = tmp_path / "results"
    add(root, "0.25.1", "blocks-first:B.KV.N.H.D", "bit-identical", check="model-transfer", subject="block-mover")
    add(root, "0.33.0", "packed:B.N.H.C", "bit-identical", check="model-transfer", subject="block-mover")
    add(root, "0.33.0", "packed:B.N.H.C", "differs", check="model-transfer", subject="manager-ids",
        repro="REPRO model-transfer release=0.33.0")
    merged(root)
    assert main([str(root), "--out", str(tmp_path / "both")]) == 0
    verdict = schema.read(tmp_path / "both" / "report.json").verdict
    assert verdict == ("RED for 1 of 2 subjects (--subject NAME reports one): block-mover GREEN: no new findings in "
                       "2 releases; manager-ids RED: 1 new finding in 1 release"), verdict
    assert main([str(root), "--subject", "block-mover", "--out", str(tmp_path / "one")]) == 0
    one = json.loads((tmp_path / "one" / "report.json").read_text())
    assert one["verdict"] == "GREEN: no new findings in 2 releases" and not one["new_findings"]
    assert main([str(root), "--subject", "nobody"]) == 2
    assert "--subject nobody: no lines of it under" in capsys.readouterr().err


def transfer_line(root, release, model, outcome, backends, run="r1", case="c", diagnosis="", subject="manager-ids"):
    """A model-transfer line as a connector's run writes it straight into the release's results.jsonl (two runs'
    lines side by side, as folders of two runs copied into one are)."""
    repro = (f"REPRO model-transfer release={release} (replay) geometry=model:{model} :: python -m pytest -k "
             f"'[{release}- and -{case}]'") if outcome == "differs" else ""
    results.append(root, Result(run=run, release=release, source="replay", subject=subject, check="model-transfer",
                                geometry=f"model:{model}", sparsity="none", outcome=outcome, case=case,
                                diagnosis=diagnosis, repro=repro, backends=backends))


MOVED_WRONG = ("layer model.layers.{n}.attn: kernel block {n}{n} (block 1 of 2 in manager block {n}) should hold "
               "source manager block 3's kernel block 7 (manager blocks [3] -> [{n}] of 16)")


def test_only_one_backend_fails_is_said_only_where_backends_ran_one_geometry(tmp_path):
    # The kernel-split model is the only one recorded with FLASHINFER: its failure says nothing of FLASHINFER.
    root = tmp_path / "results"
    transfer_line(root, "0.33.0", "split-kernels", "differs", ("FLASHINFER",), diagnosis=MOVED_WRONG.format(n=2))
    transfer_line(root, "0.33.0", "plain", "bit-identical", ("FLASH_ATTN", "TRITON_ATTN"))
    data = fold(root)
    assert [s for s in data.specific if s.dimension == "backend"] == []
    assert "Only one backend fails" not in report_md(data) and "Only one backend fails" not in report_html(data)
    # Two backends that ran one geometry and differ there: that backend is named, with the geometry held.
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN",))
    add(root, "0.33.0", "packed:B.H.N.C", "differs", backends=("FLASHINFER",), diagnosis="1 of 8 differ")
    backend = [s for s in fold(root).specific if s.dimension == "backend"]
    assert [(s.where, s.among, dict(s.fixed)) for s in backend] == [
        ("FLASHINFER", ("FLASHINFER", "FLASH_ATTN"), {"release": "0.33.0", "geometry": "packed:B.H.N.C"})]


def test_one_finding_however_many_runs_and_replays_fold(tmp_path):
    root = tmp_path / "results"
    # run r1: the generated item and the replay of its kept example, both failing on the same example
    transfer_line(root, "0.33.0", "split-kernels", "differs", ("FLASHINFER",), case="c1",
                  diagnosis=MOVED_WRONG.format(n=2))
    transfer_line(root, "0.33.0", "split-kernels", "differs", ("FLASHINFER",), case="c1",
                  diagnosis=MOVED_WRONG.format(n=2))
    # run r2, the same subject again: another example of the same bug, and the replay once more
    transfer_line(root, "0.33.0", "split-kernels", "differs", ("FLASHINFER",), run="r2", case="c2",
                  diagnosis=MOVED_WRONG.format(n=5))
    transfer_line(root, "0.33.0", "split-kernels", "differs", ("FLASHINFER",), run="r2", case="c1",
                  diagnosis=MOVED_WRONG.format(n=2))
    transfer_line(root, "0.33.0", "plain", "bit-identical", ("FLASH_ATTN",), run="r2")
    data = fold(root)
    assert data.verdict.startswith("RED: 1 new finding in 1 release — from 2 runs"), data.verdict
    [f] = data.new_findings
    assert (f.lines, f.run, f.case) == (4, "r2", "c1")  # the newest line stands for it
    # Another model, another release or another kind of failure is another finding.
    transfer_line(root, "0.33.0", "other-split", "differs", ("FLASHINFER",), diagnosis=MOVED_WRONG.format(n=2))
    transfer_line(root, "0.32.0", "split-kernels", "differs", ("FLASHINFER",), diagnosis=MOVED_WRONG.format(n=2))
    transfer_line(root, "0.32.0", "split-kernels", "differs", ("FLASHINFER",),
                  diagnosis="save of manager blocks group 0: [3] -> [2] of 16 changed 64 elements of layer layers.0's "
                            "tensor 0 on the source")
    data = fold(root)
    assert data.verdict.startswith("RED: 4 new findings in 2 releases"), data.verdict
    md = report_md(data)
    broke = md[md.index("## What broke"):md.index("## Where")]
    assert ("· manager-ids · model-transfer · all 2 releases (0.32.0–0.33.0) · model:split-kernels, "
            "model:other-split · 3 findings (6 result lines)  \n") in broke, broke
    assert "· manager-ids · model-transfer · 0.32.0 · model:split-kernels · 1 finding  \n" in broke, broke


def test_green_counts_only_releases_something_was_checked_in_and_names_the_rest(tmp_path):
    root = tmp_path / "results"
    for release in ("0.8.5.post1", "0.9.2"):  # no allocation record: the connector's check does not apply
        add(root, release, "*", "not-applicable", check="model-transfer", diagnosis="the release: no allocation record")
        add(root, release, "*", "skipped", check="drift", diagnosis="vLLM not installed: replayed")
    add(root, "0.10.2", "*", "unsupported", check="model-transfer", diagnosis="fp8 only")
    add(root, "0.33.0", "model:plain", "bit-identical", check="model-transfer")
    add(root, "0.33.0", "*", "skipped", check="drift", diagnosis="vLLM not installed: replayed")
    data = fold(root)
    assert data.verdict == ("GREEN: no new findings in 1 release; nothing checked in 0.8.5.post1, 0.9.2 (only "
                               "skipped, not-applicable), 0.10.2 (only unsupported)")
    assert data.unchecked == {"builtin": {"0.8.5.post1": "only skipped, not-applicable",
                                             "0.9.2": "only skipped, not-applicable", "0.10.2": "only unsupported"}}
    assert report_md(data).startswith(f"# kvconform conformance report\n\n**{data.verdict}**\n")


def test_a_release_with_no_line_of_a_subject_says_so(tmp_path):
    # Two subjects' runs in one folder: only one of them ran main.
    root = tmp_path / "results"
    for subject in ("block-mover", "manager-ids"):
        add(root, "0.33.0", "model:plain", "bit-identical", check="model-transfer", subject=subject)
    add(root, "main", "model:plain", "bit-identical", check="model-transfer", subject="block-mover")
    data = fold(root)
    assert data.verdict == ("GREEN for each of 2 subjects (--subject NAME reports one): block-mover GREEN: no new "
                               "findings in 2 releases; manager-ids GREEN: no new findings in 1 release; nothing "
                               "checked in main (no line)")
    assert data.unchecked["manager-ids"] == {"main": "no line"} and data.unchecked["block-mover"] == {}
    md = report_md(data)
    row = md.split("### manager-ids\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[3]
    assert row == f"| main | {sections.NO_LINE} | · |"
    tree = ET.fromstring(report_html(data))
    section = next(s for s in tree.iter("section") if s.get("data-subject") == "manager-ids")
    assert ["".join(td.itertext()) for td in section.find("table").findall("tr")[2]] == ["main", sections.NO_LINE, "·"]
