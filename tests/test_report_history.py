"""Each cell's history across reports, and the last build that passed: three nightly reports, each folded with
`--since` the one before, keep every earlier point (a chain accumulates), chart it per cell in report.html, say a
cell's last change in report.md, and carry the last passing build of a release that turned red."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from harness import results
from harness.matrix.build import PYPI, Build
from harness.report import history, schema
from harness.report.__main__ import main
from harness.results import Result

NIGHTLY = "https://wheels.vllm.ai/nightly"
STABLE = Build("0.33.0", "5f0c2b1de", "vllm-0.33.0-cp38-abi3-linux_x86_64.whl", PYPI)
MAIN = {night: Build(f"0.34.0.dev{night}+g{commit}", commit,
                     f"vllm-0.34.0.dev{night}+g{commit}-cp38-abi3-linux_x86_64.whl", NIGHTLY)
        for night, commit in ((1, "aaaaaaa1"), (2, "bbbbbbb2"), (3, "ccccccc3"))}
# main's split-agrees cell, night by night: green, one example differs, green again.
MAIN_WORDS = {1: ("bit-identical", "bit-identical"), 2: ("bit-identical", "differs"), 3: ("bit-identical",) * 2}


def night(tmp_path, n: int) -> tuple:
    """Night n's results folder (a fresh one, as each CI run has) with its report, folded --since the night before."""
    root = tmp_path / f"night{n}"
    run, when = f"2026120{n}T020000Z-00000{n}", f"2026-12-0{n}T02:30:00+00:00"
    for release, build, words in (("0.33.0", STABLE, ("bit-identical",) * 2), ("main", MAIN[n], MAIN_WORDS[n])):
        for i, word in enumerate(words):
            results.append(root, Result(
                run=run, time=when, release=release, source="live", build=build, subject="builtin",
                check="split-agrees", geometry="packed:B.N.H.C", family="packed", order="B.N.H.C", cache_dtype="auto",
                backends=("FLASH_ATTN",), sparsity="none", outcome=word, case=f"c{i}",
                repro=f"REPRO split-agrees release={release} c{i}" if word == "differs" else ""), f"{run}-gw0")
        results.merge(root, release, f"{run}-")
    since = ["--since", str(tmp_path / f"night{n - 1}" / "report.json")] if n > 1 else []
    assert main([str(root), *since]) == 0
    return root, schema.read(root / "report.json")


@pytest.fixture
def nights(tmp_path):
    return [night(tmp_path, n) for n in (1, 2, 3)]


def test_a_chain_of_reports_keeps_every_earlier_point(nights):
    (_, r1), (_, r2), (_, r3) = nights
    assert [p.runs for p in r3.history] == [(r1.runs[0].run,), (r2.runs[0].run,)]
    assert history.series(r3, "builtin", "main", "split-agrees") == [
        ("2026-12-01T02:30:00+00:00", (2, 2, False)), ("2026-12-02T02:30:00+00:00", (1, 2, True)),
        ("2026-12-03T02:30:00+00:00", (2, 2, False))]
    assert [c for _, c in history.series(r3, "builtin", "0.33.0", "split-agrees")] == [(2, 2, False)] * 3


def test_several_earlier_reports_given_at_once_are_the_same_points(nights, tmp_path):
    (root, r3) = nights[2]
    out = tmp_path / "again"
    assert main([str(root), "--out", str(out), "--since", str(tmp_path / "night1" / "report.json"),
                 "--since", str(tmp_path / "night2" / "report.json")]) == 0
    again = schema.read(out / "report.json")
    assert [p.runs for p in again.history] == [p.runs for p in r3.history]
    assert again.changes.since.endswith("night2/report.json")  # what changed: since the last one given
    assert [c.release for c in again.changes.fixes] == ["main"]


def test_the_markdown_keeps_each_cells_last_change(nights):
    (root2, _), (root3, _) = nights[1], nights[2]
    md3 = (root3 / "report.md").read_text()
    row = next(line for line in md3.splitlines() if line.startswith("| main | live of vllm 0.34.0.dev3"))
    assert "2/2 (was 1/2 red on 2026-12-02)" in row, row
    stable = next(line for line in md3.splitlines() if line.startswith("| 0.33.0 | live of vllm 0.33.0 (5f0c2b1de)"))
    assert "(was" not in stable, stable  # unchanged across the three nights
    md2 = (root2 / "report.md").read_text()
    assert "**1/2** **✗1** (was 2/2 on 2026-12-01)" in md2


def test_report_html_charts_each_cells_history(nights):
    page = ET.fromstring((nights[2][0] / "report.html").read_text())
    svg = "{http://www.w3.org/2000/svg}"
    cell = next(td for td in page.iter("td") if td.get("data-release") == "main" and td.get("data-check"))
    spark = cell.find("svg") if cell.find("svg") is not None else cell.find(f"{svg}svg")
    assert spark is not None, ET.tostring(cell)
    dots = [c for c in spark.iter() if c.tag.endswith("circle")]
    assert [d.get("class") for d in dots] == [None, "red", None]
    assert [float(d.get("cy")) for d in dots][1] > float(dots[0].get("cy"))  # the red night passed less
    title = next(t for t in spark.iter() if t.tag.endswith("title")).text
    assert title == "2026-12-01: 2/2; 2026-12-02: 1/2 red; 2026-12-03: 2/2"


def test_a_release_that_turned_red_keeps_the_build_that_last_passed(nights):
    (_, r1), (root2, r2), (_, r3) = nights
    assert r1.last_passed["builtin"]["main"].pin == f"vllm=={MAIN[1].version} --extra-index-url {NIGHTLY}"
    # Night 2 is red on main: its pin stays night 1's build, named as such.
    assert r2.last_passed["builtin"]["main"].build.commit == "aaaaaaa1"
    assert r2.last_passed["builtin"]["0.33.0"].pin == "vllm==0.33.0"
    md2 = (root2 / "report.md").read_text()
    assert re.search(r"^- builtin: main not passing in this report \(red, or not checked\); last passed on vllm "
                     r"0\.34\.0\.dev1\+gaaaaaaa1 \(aaaaaaa1\) .* run 20261201T020000Z-000001", md2, re.M), md2
    assert "- builtin: newest passing release 0.33.0: `vllm==0.33.0` (vllm 0.33.0 (5f0c2b1de)" in md2
    assert r3.last_passed["builtin"]["main"].build.commit == "ccccccc3"


def test_without_earlier_reports_there_is_no_history_and_no_change_said(tmp_path):
    root, r1 = night(tmp_path, 1)
    assert r1.history == () and "(was" not in (root / "report.md").read_text()
    assert "<svg" not in (root / "report.html").read_text()
