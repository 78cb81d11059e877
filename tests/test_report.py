"""The report says what broke first (verdict, new findings with REPRO lines, one mark per matrix cell) and never
merges outcome words: a cell's mark is its worst outcome, a known finding never hides a new one."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from harness import report, results
from harness.results import OUTCOMES, PASSING, Result


def add(root, release, geometry, outcome, check="bit-identity", known="", source="replay", diagnosis="", repro="",
        backends=()):
    """One line as a run writes it: a geometry named `family:order[@cache dtype]` carries those fields."""
    family, _, rest = geometry.partition(":")
    order, _, dtype = rest.partition("@")
    where = dict(family=family, order=order, cache_dtype=dtype or "auto", backends=backends) if rest else {}
    results.append(root, Result(run="r1", release=release, source=source, subject="builtin", geometry=geometry,
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
    return report.fold(results.read(merged(root)))


def matrix_rows(md: str, subject: str = "builtin") -> dict[str, list[str]]:
    """The first-screen matrix of `subject` as {release: [cell, ...]} (the columns after `contracts from`)."""
    table = md.split(f"### {subject}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return {cells[0]: cells[2:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in table[2:])}


def test_matrix_keeps_every_outcome_word_apart(tmp_path):
    data = fold(build(tmp_path))
    assert data["releases"] == ["0.8.5.post1", "0.9.2", "0.30.0", "main"]
    cell = data["matrix"]["builtin"]["0.9.2"]["blocks-first:B.KV.N.H.D"]
    assert cell == {"differs": 1, "unsupported": 1, "bit-identical": 1}  # worst first
    cell = data["matrix"]["builtin"]["0.30.0"]["kv-first:KV.B.N.H.D"]
    assert cell == {"harness-error": 1, "contract-error [known]": 1, "stale": 1}
    assert data["matrix"]["builtin"]["0.8.5.post1"]["*"] == {"install-error": 1}
    assert data["matrix"]["builtin"]["main"]["packed:B.H.N.C"] == {"skipped": 1}
    assert data["checks"]["builtin"]["0.30.0"]["bit-identity"] == {"harness-error": 1, "contract-error [known]": 1}


def test_new_known_and_stale_findings_are_listed_apart(tmp_path):
    data = fold(build(tmp_path))
    assert sorted(r["outcome"] for r in data["new_findings"]) == ["differs", "harness-error", "install-error"]
    assert [k["id"] for k in data["known_findings"]] == ["builtin#1"]
    assert [s["known"] for s in data["stale_findings"]] == ["builtin#2"]
    assert data["unsupported"] == [{"subject": "builtin", "reason": "head_dim 80", "count": 1}]


def test_verdict_counts_new_findings_and_their_releases(tmp_path):
    assert fold(build(tmp_path))["verdict"] == "RED: 3 new findings in 3 releases"
    root = tmp_path / "green"
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical")
    add(root, "0.33.0", "packed:B.H.N.C", "contract-error", known="builtin#1")  # known: reported, still green
    add(root, "0.33.0", "*", "stale", check="split-agrees", known="builtin#2")
    add(root, "0.28.0", "packed:B.H.N.C", "skipped", check="vllm-write")
    assert fold(root)["verdict"] == "GREEN: no new findings in 2 releases"
    add(root, "0.28.0", "packed:B.H.N.C", "accepted", check="rejects-malformed")
    assert fold(root)["verdict"] == "RED: 1 new finding in 1 release"


@pytest.mark.parametrize("counts, shown", [
    ({"bit-identical": 70, "rejected": 50}, ("✓", 120)),
    ({"bit-identical": 70, "rejected": 50, "skipped": 1}, ("○", 1)),
    ({"within-tolerance": 9, "stale": 1}, ("◌", 1)),
    ({"skipped": 3, "not-run": 2}, ("–", 2)),
    ({"bit-identical": 5, "contract-error [known]": 2}, ("◆", 2)),
    ({"contract-error [known]": 2, "differs": 1}, ("✗", 1)),
    ({"differs": 4, "accepted": 1, "subject-error": 2, "harness-error": 1}, ("!", 3)),
])
def test_a_cell_shows_its_worst_outcome(counts, shown):
    m, n = report.cell(counts)
    assert (m.glyph, n) == shown


def test_only_passing_words_get_the_pass_mark():
    for word in OUTCOMES:
        assert (report.mark(word) is report.PASS) == (word in PASSING), word
        assert report.mark(f"{word} [known]") is report.KNOWN
    assert {report.mark(w) for w in OUTCOMES if w not in PASSING} >= {report.ERROR, report.FAIL, report.SKIPPED}


def test_known_finding_never_hides_a_new_one(tmp_path):
    root = build(tmp_path)
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "contract-error", check="determinism", known="builtin#3")
    md = report.markdown(fold(root))
    columns = md.split("### builtin\n\n", 1)[1].splitlines()[0].strip("|").split("|")[2:]
    assert [c.strip() for c in columns] == ["install", "split-agrees", "bit-identity", "determinism", "vllm-write"]
    rows = matrix_rows(md)
    assert rows["0.30.0"][2] == "**!1**"  # harness-error beside a known contract-error
    assert rows["0.9.2"][2:4] == ["**✗1**", "◆1"]  # a known finding alone is a known mark
    assert rows["0.30.0"][1] == "◌1" and rows["0.8.5.post1"][0] == "**!1**" and rows["main"][4] == "○1"
    assert rows["main"][:4] == ["·"] * 4


def test_new_findings_come_first_grouped_with_their_repro_lines(tmp_path):
    root = build(tmp_path)
    for release, case in (("0.30.0", 1), ("0.30.0", 1), ("0.30.0", 2), ("main", 3), ("main", 4)):
        add(root, release, "packed:B.H.N.C", "differs", diagnosis=f"{case} of 64 differ, max ULP {case}",
            repro=f"REPRO bit-identity case {case}")
    md = report.markdown(fold(root))
    head, matrix = md.split("## What broke")[0], md.index("## Where")
    assert head.splitlines()[2] == "**RED: 8 new findings in 4 releases**"
    broke = md[md.index("## What broke"):matrix]
    # worst first (errors before value differences); the same diagnosis up to its numbers is one kind of finding
    assert [m.group(1) for m in re.finditer(r"^- \*\*(.+?)\*\*", broke, re.M)] == [
        "! harness-error", "! install-error", "✗ differs", "✗ differs"]
    kind = next(k for k in broke.split("\n- ") if "of 64 differ" in k)
    assert "· bit-identity · 0.30.0, main · packed:B.H.N.C · 5 results" in kind
    assert "1 of 64 differ, max ULP 1" in kind and "of 8 differ" not in kind  # another diagnosis, another kind
    assert broke.count("REPRO bit-identity case 1") == 1  # deduplicated
    shown = report.REPROS_SHOWN
    assert sum(f"REPRO bit-identity case {c}" in broke for c in range(1, 5)) == shown
    assert f"+{4 - shown} more REPRO lines" in broke
    assert "REPRO harness 0.30.0" in broke and "REPRO differs 0.9.2" in broke
    assert md.index("uv failed") < matrix  # a finding without REPRO line still says why


def test_kinds_beyond_the_first_screen_are_under_details(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "FIRST_GROUPS", 1)
    md = report.markdown(fold(build(tmp_path)))
    assert "+2 more kinds of new finding: under Details" in md
    details = md[md.index("## Details"):]
    assert "REPRO differs 0.9.2" in details and "REPRO harness 0.30.0" not in details


def test_outcome_words_fit_the_check(tmp_path):
    assert report.says("drift", "bit-identical") == "no drift"
    assert report.says("drift", "differs [known]") == "drift [known]"
    assert report.says("bit-identity", "bit-identical") == "bit-identical"
    root = tmp_path / "results"
    add(root, "0.33.0", "*", "bit-identical", check="drift", source="live")
    add(root, "0.32.0", "*", "differs", check="drift", source="live", diagnosis="axes changed", repro="REPRO drift")
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", check="split-agrees")
    data = fold(root)
    assert data["checks"]["builtin"]["0.33.0"]["drift"] == {"bit-identical": 1}  # the stored word stays
    md = report.markdown(data)
    assert "- **✗ drift** · builtin · drift · 0.32.0 · whole release" in md
    details = md[md.index("## Details"):]
    assert "| 0.33.0 | no drift 1 | agrees 1 |" in details and "bit-identical" not in details


def test_html_is_well_formed_and_says_the_same(tmp_path):
    root = build(tmp_path)
    add(root, "main", "packed:B.H.N.C", "differs", diagnosis="x < y & z", repro="REPRO <b>1</b>")
    data = fold(root)
    page, md = report.html_page(data), report.markdown(data)
    tree = ET.fromstring(page)  # well-formed: parses as XML, every tag closed, every '<' and '&' escaped
    text = " ".join(" ".join(e.itertext()) for e in tree.iter())
    assert tree.find("head/title").text == f"kvconform: {data['verdict']}"
    verdict = next(e for e in tree.iter("p") if "verdict" in e.get("class", ""))
    assert (verdict.text, verdict.get("class")) == ("RED: 4 new findings in 4 releases", "verdict red")
    pres = [e.text for e in tree.iter("pre")]
    assert pres == re.findall(r"^  (REPRO .*)$", md, re.M) == ["REPRO harness 0.30.0", "REPRO differs 0.9.2",
                                                               "REPRO <b>1</b>"]
    assert "x < y & z" in text and "uv failed" in text
    # the release x check matrix: the same marks and counts as the markdown, each coloured by its outcome
    table = tree.findall(".//table")[0]
    rows = {tr[0].text: tr[2:] for tr in table.findall("tr")[1:]}
    for release, cells in matrix_rows(md).items():
        assert [td.text for td in rows[release]] == [c.strip("*") for c in cells]
    red = rows["0.30.0"][2]
    assert red.get("class") == "m error" and red.get("title") == "harness-error 1 · contract-error [known] 1"
    assert [td.get("class") for td in rows["main"]] == ["none", "none", "m fails", "m skipped"]


def test_command_writes_markdown_html_and_json(tmp_path):
    root = merged(build(tmp_path))
    assert report.main([str(root), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# kvconform conformance report\n\n**RED: 3 new findings in 3 releases**\n")
    assert re.search(r"\| 0\.9\.2 \| replay, run r1 at \S+ \| · \| · \| \*\*✗1\*\* \| · \|", md), md
    assert ET.fromstring((tmp_path / "out" / "report.html").read_text()).tag == "html"
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["releases"][0] == "0.8.5.post1" and data["verdict"].startswith("RED")


def test_release_spans_follow_the_report_order():
    releases = ["0.8.5.post1", "0.9.2", "0.10.2", "0.11.2", "0.33.0", "main"]
    assert report.span({"0.9.2", "0.11.2", "0.10.2", "main"}, releases) == "0.9.2–0.11.2, main"
    assert report.span(releases, releases) == "all 6 releases (0.8.5.post1–main)"


def test_no_results_is_an_error(tmp_path):
    assert report.main([str(tmp_path)]) == 1


def test_not_applicable_is_its_own_mark_never_a_pass_nor_a_finding(tmp_path):
    root = tmp_path / "results"
    add(root, "0.25.1", "blocks-first:B.KV.N.H.D", "bit-identical", check="split-agrees")
    add(root, "0.25.1", "*", "not-applicable", check="bit-identity", diagnosis="declares split; needs forward")
    add(root, "0.25.1", "blocks-first:B.KV.N.H.D", "unsupported", check="transfer", diagnosis="fp8 only")
    data = fold(root)
    assert data["verdict"].startswith("GREEN") and not data["new_findings"]
    assert data["checks"]["builtin"]["0.25.1"]["bit-identity"] == {"not-applicable": 1}
    assert report.mark("not-applicable") not in (report.PASS, report.UNSUPPORTED, report.SKIPPED)
    row = matrix_rows(report.markdown(data))["0.25.1"]
    assert row == ["✓1", "⊘1", "∅1"]  # split-agrees, transfer, bit-identity in the reader's order
    assert "not-applicable" in report.html_page(data)


def test_cache_dtypes_get_their_own_matrix_and_geometries_name_their_backends(tmp_path):
    root = tmp_path / "results"
    add(root, "0.33.0", "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN", "PLANTED"))
    add(root, "0.33.0", "packed:B.N.H.C@fp8_e4m3", "differs", diagnosis="1 of 8 differ", repro="REPRO fp8")
    add(root, "0.33.0", "head-split:B.S.N.D@nvfp4", "unsupported", diagnosis="cache dtype nvfp4 not supported")
    data = report.fold(results.read(merged(root)))
    assert {d: dict(c) for d, c in data["cache_dtypes"]["builtin"]["0.33.0"].items()} == {
        "auto": {"bit-identical": 1}, "fp8_e4m3": {"differs": 1}, "nvfp4": {"unsupported": 1}}
    md = report.markdown(data)
    table = md[md.index("#### builtin: release × cache dtype"):].splitlines()
    assert table[2] == "| release | auto | fp8_e4m3 | nvfp4 |"
    assert re.match(r"\| 0\.33\.0 \| \S+ \| \S+ \| \S+ \|", table[4])
    assert report._family(data, "packed:B.N.H.C@fp8_e4m3") == "packed@fp8_e4m3"
    # The backends are the run's (its lines), not the shipped recordings', which have no PLANTED backend.
    backends = md[md.index("## Which backends hand each geometry"):].splitlines()
    assert "- packed:B.H.N.C: FLASH_ATTN (0.33.0), PLANTED (0.33.0)" in backends, backends
    assert "release × cache dtype" in report.html_page(data)


def test_the_report_names_the_run_each_release_comes_from(tmp_path):
    root = tmp_path / "results"
    results.append(root, Result(release="0.25.1", source="replay", subject="builtin", geometry="g",
                                check="bit-identity", outcome="bit-identical", run="20261201T090000Z-aaaaaa"), "w")
    results.append(root, Result(release="0.33.0", source="live", subject="builtin", geometry="g",
                                check="bit-identity", outcome="bit-identical", run="20261201T100000Z-bbbbbb",
                                time="2026-12-01T10:02:03+00:00"), "w")
    data = fold(root)
    assert [r["run"] for r in data["runs"]["0.25.1"]] == ["20261201T090000Z-aaaaaa"]
    assert data["runs"]["0.33.0"] == [{"run": "20261201T100000Z-bbbbbb", "time": "2026-12-01T10:02:03+00:00"}]
    md = report.markdown(data)
    assert "| 0.33.0 | live, run 20261201T100000Z-bbbbbb at 2026-12-01T10:02:03+00:00 |" in md, md
    assert "run 20261201T090000Z-aaaaaa at 20" in md  # the time append() stamped


def test_a_timeout_is_an_error_in_the_report_never_a_pass(tmp_path):
    root = tmp_path / "results"
    add(root, "0.25.1", "g", "timeout", diagnosis="timeout: item ran past its limit of 600 s")
    data = fold(root)
    assert data["verdict"].startswith("RED") and report.mark("timeout") is report.ERROR
