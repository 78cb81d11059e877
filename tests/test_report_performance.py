"""The report shows the performance lane's lines (harness.results.timings) beside the conformance cells: a paged / dense
column in each benched subject's release x check matrix (the worst ratio and its mark; bold / red with a new performance
finding), a Performance section (one row per release, workload and tile, the new findings first, the stale known ones
apart) and a line under the verdict; the verdict itself never changes. A subject or release only benched has its
matrix too, and performance lines alone are a report whose verdict says no conformance ran. Every report here is built
from hand-written result and performance lines."""

import json
import xml.etree.ElementTree as ET

import pytest
from test_report import add, matrix_rows, merged

from harness import results
from harness.report import cells, schema, sections
from harness.report.__main__ import main
from harness.report.fold import report_data
from harness.report.html import report_html
from harness.report.markdown import report_md
from harness.results import timings
from harness.results.timings import Timing


def bench(release, geometry, workload, outcome, ratio=0.0, known="", tile="autotuned", band=0.02, subject="builtin",
          **fields):
    """One performance line as the lane writes it (ratio: paged median / dense median)."""
    return Timing(run="b1", release=release, source="replay", subject=subject, geometry=geometry, workload=workload,
                  tile=tile, outcome=outcome, ratio=ratio, band=band, known=known, repeats=30,
                  roofline=f"{workload}: 40% of copy rate" if ratio else "", **fields)


def conformance(root, releases=("0.25.1", "0.33.0")):
    """Passing conformance lines of builtin (and of one unbenched subject) in `releases`: a GREEN verdict."""
    for release in releases:
        add(root, release, "packed:B.H.N.C", "bit-identical", backends=("FLASH_ATTN",))
    add(root, releases[-1], "packed:B.H.N.C", "bit-identical", subject="other")
    return merged(root)


# Within, slower new, slower known, not-timed (new), stale: every word the lane writes, in one release; the
# other release is benched but fast.
LINES = (
    bench("0.33.0", "packed:B.H.N.C", "decode 4k", "within", 0.95),
    bench("0.33.0", "packed:B.N.H.C", "decode 4k", "slower", 1.31),
    bench("0.33.0", "packed:B.H.N.C", "prefill 1k", "slower", 1.28, known="builtin#perf1", band=0.25),
    bench("0.33.0", "kv-first:KV.B.N.H.D", "prefill 1k", "not-timed", diagnosis="the paged forward raised"),
    bench("0.33.0", "*", "prefill *", "stale", 1.5, known="builtin#perf2", tile="*"),  # its worst covered: no cell
    bench("0.25.1", "packed:B.H.N.C", "decode 4k", "within", 0.97),
)


def fold(root, lines=LINES):
    """The report's data of `root`'s result lines and of `lines`, written as the performance lane writes them and
    read back."""
    timings.write(root, list(lines))
    return report_data(results.read(root), timings=timings.read(root))


def test_the_performance_part_of_report_json(tmp_path):
    data = fold(conformance(tmp_path / "results"))
    perf = data.as_json()["performance"]  # as report.json holds it
    assert list(perf) == ["builtin"] and list(perf["builtin"]) == ["0.25.1", "0.33.0"]
    entry = perf["builtin"]["0.33.0"]
    # every word apart, worst first; a known finding's marked as the conformance cells mark it
    assert entry["counts"] == {"slower": 1, "not-timed": 1, "slower [known]": 1, "stale": 1, "within": 1}
    assert entry["worst"] == {"ratio": 1.31, "geometry": "packed:B.N.H.C", "workload": "decode 4k",
                              "tile": "autotuned", "outcome": "slower", "known": "", "band": 0.02, "limit": 1.1,
                              "roofline": "decode 4k: 40% of copy rate", "diagnosis": ""}
    assert [(t["geometry"], t["outcome"]) for t in entry["new_findings"]] == [
        ("packed:B.N.H.C", "slower"), ("kv-first:KV.B.N.H.D", "not-timed")]
    assert [t["known"] for t in entry["stale_findings"]] == ["builtin#perf2"]
    assert [(r["workload"], r["new_findings"], r["worst"]["ratio"], r["worst"]["limit"]) for r in entry["rows"]] == [
        ("decode 4k", 1, 1.31, 1.1), ("prefill 1k", 1, 1.28, 1.25)]  # limit: max(threshold, 1 + band)
    assert perf["builtin"]["0.25.1"]["new_findings"] == [] and perf["builtin"]["0.25.1"]["worst"]["ratio"] == 0.97
    assert data.performance["builtin"]["0.33.0"].worst.geometry == "packed:B.N.H.C"


def test_performance_lines_never_change_the_verdict(tmp_path):
    root = conformance(tmp_path / "results")
    alone = report_data(results.read(root))
    data = fold(root)
    assert data.verdict == alone.verdict == ("GREEN for each of 2 subjects (--subject NAME reports one): builtin "
                                                   "GREEN: no new findings in 2 releases; other GREEN: no new findings "
                                                   "in 1 release; nothing checked in 0.25.1 (no line)")
    assert data.new_findings == () and data.keys == alone.keys
    line = "Performance: 2 new findings (nox -s bench fails on them; not a conformance outcome)"
    md = report_md(data)
    assert md.startswith(f"# kvconform conformance report\n\n**{data.verdict}**\n\n{line}\n")
    tree = ET.fromstring(report_html(data))
    verdict = next(e for e in tree.iter("p") if "verdict" in e.get("class", "").split())
    assert (verdict.text, verdict.get("class")) == (data.verdict, "verdict green")
    assert next(e for e in tree.iter("p") if e.get("class") == "bench-verdict").text == line
    # a red conformance verdict stays the same too; no new performance finding: no line
    add(root, "0.33.0", "packed:B.H.N.C", "differs", diagnosis="1 of 8 differ")
    data = fold(merged(root), [t for t in LINES if not t.new_finding])
    assert data.verdict == ("RED for 1 of 2 subjects (--subject NAME reports one): builtin RED: 1 new finding in 1 "
                               "release; other GREEN: no new findings in 1 release; nothing checked in 0.25.1 "
                               "(no line)")
    assert "Performance:" not in report_md(data) and 'class="bench-verdict"' not in report_html(data)


def test_the_release_by_check_matrix_gets_a_paged_over_dense_column(tmp_path):
    root = conformance(tmp_path / "results", ("0.22.1", "0.25.1", "0.33.0"))
    data = fold(root)
    md = report_md(data)
    head = md.split("### builtin\n\n", 1)[1].splitlines()[0]
    assert head == f"| release | contracts from | bit-identity | {sections.BENCH_COLUMN} |"
    rows = matrix_rows(md)
    # the worst ratio with its mark (bold: a new finding), the other words' marks beside it; not benched: ·
    assert rows["0.33.0"] == ["1/1", "**1.31x ✗** **–1** ◆1 ◌1"]
    assert rows["0.25.1"] == ["1/1", "0.97x ✓"] and rows["0.22.1"] == ["1/1", "·"]
    assert sections.BENCH_LEGEND in md
    # a subject without performance lines has no such column
    assert md.split("### other\n\n", 1)[1].splitlines()[0] == "| release | contracts from | bit-identity |"
    tree = ET.fromstring(report_html(data))
    table = tree.find(".//table[@id='m0']")
    assert [th.text for th in table.find("tr")][-1] == sections.BENCH_COLUMN
    tds = {tr[0].text: tr[-1] for tr in table.findall("tr")[1:]}
    assert ["".join(td.itertext()) for td in tds.values()] == ["·", "0.97x ✓", "1.31x ✗ –1 ◆1 ◌1"]
    assert tds["0.33.0"].get("title") == "slower 1 · not-timed 1 · slower [known] 1 · stale 1 · within 1"
    assert "c" not in tds["0.33.0"].get("class").split()  # no drill-down rows: not clickable
    assert len(tree.find(".//table[@id='m1']").find("tr")) == 3  # other: release, contracts from, bit-identity


@pytest.mark.parametrize("line, md_face, html_class", [
    (bench("0.33.0", "packed:B.H.N.C", "decode 4k", "slower", 1.31), "**1.31x ✗**", "cell bench red"),
    (bench("0.33.0", "packed:B.H.N.C", "decode 4k", "slower", 1.28, known="builtin#perf1"), "1.28x ◆",
     "cell bench known"),
    (bench("0.33.0", "packed:B.H.N.C", "decode 4k", "within", 0.95), "0.95x ✓", "cell bench pass"),
    (bench("0.33.0", "packed:B.H.N.C", "decode 4k", "not-timed"), "**–1**", "cell bench red"),
    (bench("0.33.0", "packed:B.H.N.C", "decode 4k", "not-timed", known="builtin#perf1"), "◆1", "cell bench known"),
    (bench("0.33.0", "*", "decode *", "stale", known="builtin#perf1"), "◌1", "cell bench stale"),
])
def test_the_column_fails_on_a_new_finding_only(tmp_path, line, md_face, html_class):
    data = fold(conformance(tmp_path / "results"), [line])
    assert matrix_rows(report_md(data))["0.33.0"][-1] == md_face
    td = ET.fromstring(report_html(data)).find(".//table[@id='m0']").findall("tr")[-1][-1]
    assert td.get("class") == html_class and "".join(td.itertext()) == md_face.replace("*", "")
    assert data.verdict.startswith("GREEN")


def test_a_known_finding_never_hides_a_new_one_in_the_column(tmp_path):
    lines = [bench("0.33.0", "packed:B.H.N.C", "prefill 1k", "slower", 1.5, known="builtin#perf1"),
             bench("0.33.0", "packed:B.N.H.C", "decode 4k", "slower", 1.2)]
    data = fold(conformance(tmp_path / "results"), lines)
    assert matrix_rows(report_md(data))["0.33.0"][-1] == "**1.50x ◆** **✗1**"  # the worst ratio is the known one's


def test_the_performance_section_lists_the_new_findings_first_and_the_stale_apart(tmp_path):
    lines = [*LINES, bench("0.25.1", "packed:B.H.N.C", "decode 4k", "slower", 1.4, tile="pinned 64x64")]
    data = fold(conformance(tmp_path / "results"), lines)
    md = report_md(data)
    section = md.split(f"\n## {sections.BENCH_TITLE}\n\n", 1)[1].split("\n\n## ", 1)[0].split("\n\n")
    assert section[0] == sections.BENCH_NOTE and section[1] == "### builtin"
    assert section[2].splitlines() == [
        "| release | workload | tile | paged / dense | geometry | limit | roofline | words |",
        "|---|---|---|---|---|---|---|---|",
        "| 0.25.1 | decode 4k | pinned 64x64 | **1.40x ✗** | packed:B.H.N.C | 1.10x | decode 4k: 40% of copy rate "
        "| slower 1 |",
        "| 0.33.0 | decode 4k | autotuned | **1.31x ✗** | packed:B.N.H.C | 1.10x | decode 4k: 40% of copy rate "
        "| slower 1 · within 1 |",
        "| 0.33.0 | prefill 1k | autotuned | **1.28x ◆** **–1** | packed:B.H.N.C | 1.25x | prefill 1k: 40% of copy "
        "rate | not-timed 1 · slower [known] 1 |",
        "| 0.25.1 | decode 4k | autotuned | 0.97x ✓ | packed:B.H.N.C | 1.10x | decode 4k: 40% of copy rate "
        "| within 1 |"]
    assert section[3:] == [f"### {sections.BENCH_STALE}",
                           "- builtin#perf2: workload prefill *, tile *, geometry * on 0.33.0"]
    assert md.index("## Where") < md.index(sections.BENCH_TITLE) < md.index("## Known findings")
    tree = ET.fromstring(report_html(data))
    table = tree.find(".//table[@id='p0']")
    rows = [["".join(td.itertext()) for td in tr] for tr in table.findall("tr")[1:]]
    assert rows == [[c.strip().replace("*", "") for c in line.strip("|").split("|")]
                    for line in section[2].splitlines()[2:]]
    assert [tr[3].get("class") for tr in table.findall("tr")[1:]] == [
        "cell bench red", "cell bench red", "cell bench red", "cell bench pass"]
    assert any(h.text == sections.BENCH_TITLE for h in tree.iter("h2"))


def test_no_performance_lines_no_column_no_section(tmp_path):
    data = report_data(results.read(conformance(tmp_path / "results")))
    assert data.performance == {}
    md, html = report_md(data), report_html(data)
    for text in (sections.BENCH_COLUMN, sections.BENCH_TITLE, sections.BENCH_LEGEND, "Performance:"):
        assert text not in md and text not in html


def test_the_command_reads_the_performance_lines(tmp_path):
    root = conformance(tmp_path / "results")
    timings.write(root, list(LINES))
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    data = schema.read(tmp_path / "out" / "report.json")
    assert data.verdict.startswith("GREEN") and data.performance["builtin"]["0.33.0"].worst.ratio == 1.31
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Performance: 2 new findings" in md and f"## {sections.BENCH_TITLE}" in md


@pytest.mark.parametrize("content, says", [
    ("{not json\n", "not a performance line: Expecting property name"),
    (json.dumps({"schema": 99}) + "\n", "not a performance line: schema 99, this kvconform reads 1"),
    (json.dumps({"schema": 1, "outcome": "faster"}) + "\n", "not a performance line: "),
])
def test_a_malformed_performance_file_is_an_error_naming_it(tmp_path, capsys, content, says):
    root = conformance(tmp_path / "results")
    bad = root / "0.33.0" / timings.FILE
    bad.write_text(content)
    assert main([str(root), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m harness.report: {bad}:1: {says}"), err
    assert not (tmp_path / "out").exists()


def test_every_performance_word_has_a_mark_and_a_rank():
    for w in (*timings.WORDS, *(cells.performance_word(o, "x#perf1") for o in timings.WORDS)):
        assert cells.performance_mark(w) and cells.performance_rank(w)
    assert cells.performance_word("within", "x#perf1") == "within"  # a known finding predicts no pass
    assert cells.performance_mark("slower").red and cells.performance_mark("not-timed").red
    assert not cells.performance_mark("slower [known]").red and not cells.performance_mark("within").red


NO_CONFORMANCE = "NO CONFORMANCE RESULTS: only the performance lane's lines (nox -s bench) in 2 releases"


def test_performance_lines_alone_are_a_report_that_claims_no_conformance(tmp_path, capsys):
    root = tmp_path / "results"
    timings.write(root, [bench("0.25.1", "packed:B.H.N.C", "decode 4k", "within", 0.97),
                         bench("0.33.0", "packed:B.H.N.C", "decode 4k", "slower", 1.31),
                         bench("0.33.0", "packed:B.H.N.C", "decode 4k", "within", 1.02, subject="slow")])
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    assert NO_CONFORMANCE in capsys.readouterr().out
    data = schema.read(tmp_path / "out" / "report.json")
    assert data.verdict == NO_CONFORMANCE and data.releases == ("0.25.1", "0.33.0") and data.runs == ()
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith(f"# kvconform conformance report\n\n**{NO_CONFORMANCE}**\n\nPerformance: 1 new finding "
                         "(nox -s bench fails on them; not a conformance outcome)\n\n"
                         f"- builtin: {sections.UNCHECKED}\n- slow: {sections.UNCHECKED}\n")
    where = md.split("## Where: release × check\n", 1)[1]
    # every release of the report a row, contracts from the performance lines, no check column: none ran
    assert where.split("### builtin\n\n", 1)[1].split("\n\n", 1)[0].splitlines() == [
        f"| release | contracts from | {sections.BENCH_COLUMN} |", "|---|---|---|",
        "| 0.25.1 | replay (bench) | 0.97x ✓ |", "| 0.33.0 | replay (bench) | **1.31x ✗** |"]
    assert where.split("### slow\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:] == [
        f"| 0.25.1 | {sections.NO_LINE} | · |", "| 0.33.0 | replay (bench) | 1.02x ✓ |"]
    tree = ET.fromstring((tmp_path / "out" / "report.html").read_text())
    verdict = next(e for e in tree.iter("p") if "verdict" in e.get("class", "").split())
    assert (verdict.text, verdict.get("class")) == (NO_CONFORMANCE, "verdict none")  # not green
    assert ["".join(p.itertext()) for p in tree.iter("p") if p.get("class") == "totals"] == [
        f"builtin: {sections.UNCHECKED}", f"slow: {sections.UNCHECKED}"]
    tables = [tree.find(f".//table[@id='m{n}']") for n in (0, 1)]
    assert [[th.text for th in t.find("tr")] for t in tables] == [
        ["release", "contracts from", sections.BENCH_COLUMN]] * 2
    assert [["".join(td.itertext()) for td in tr] for t in tables for tr in t.findall("tr")[1:]] == [
        ["0.25.1", "replay (bench)", "0.97x ✓"], ["0.33.0", "replay (bench)", "1.31x ✗"],
        ["0.25.1", sections.NO_LINE, "·"], ["0.33.0", "replay (bench)", "1.02x ✓"]]
    assert tables[0].findall("tr")[2][-1].get("class") == "cell bench red"


def test_neither_results_nor_performance_lines_is_an_error_naming_both(tmp_path, capsys):
    (tmp_path / "0.33.0").mkdir()
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "results.jsonl" in err and timings.FILE in err, err
    assert not (tmp_path / "out").exists()


def test_a_subject_or_release_only_benched_gets_its_matrix(tmp_path):
    root = conformance(tmp_path / "results")  # builtin in 0.25.1 and 0.33.0, other in 0.33.0
    data = fold(root, [bench("0.22.1", "packed:B.H.N.C", "decode 4k", "within", 0.96),
                       bench("0.33.0", "packed:B.H.N.C", "decode 4k", "slower", 1.4, subject="slow")])
    assert data.releases == ("0.22.1", "0.25.1", "0.33.0")  # 0.22.1: benched only, in version order
    # the releases checked, not the benched one; the subject only benched has no verdict
    assert data.verdict == ("GREEN for each of 2 subjects (--subject NAME reports one): builtin GREEN: no new "
                               "findings in 2 releases; other GREEN: no new findings in 1 release; nothing checked in "
                               "0.25.1 (no line)")
    md = report_md(data)
    assert f"- slow: {sections.UNCHECKED}\n" in md.split("## Runs folded", 1)[0]
    table = md.split("### builtin\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[2].startswith("| 0.22.1 | replay (bench) | · | 0.96x ✓ |")
    assert matrix_rows(md, "slow") == {"0.22.1": ["·"], "0.25.1": ["·"], "0.33.0": ["**1.40x ✗**"]}
    assert md.split("### slow\n\n", 1)[1].splitlines()[0] == f"| release | contracts from | {sections.BENCH_COLUMN} |"
    assert matrix_rows(md, "other")["0.33.0"] == ["1/1"]  # not benched: no column
    tree = ET.fromstring(report_html(data))
    sections_ = {s.get("data-subject"): s for s in tree.iter("section")}
    assert list(sections_) == ["builtin", "other", "slow"]
    rows = [["".join(td.itertext()) for td in tr] for tr in sections_["slow"].find("table").findall("tr")]
    assert rows == [["release", "contracts from", sections.BENCH_COLUMN], ["0.22.1", sections.NO_LINE, "·"],
                    ["0.25.1", sections.NO_LINE, "·"], ["0.33.0", "replay (bench)", "1.40x ✗"]]
