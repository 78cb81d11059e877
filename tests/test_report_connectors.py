"""The connector compatibility table (harness.report.connectors): each cell one word from its result lines, its
REPRO, words or reason beside the table, and the report ending with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import results
from harness.report import connectors
from harness.report.__main__ import main
from harness.results import Result

REPO = Path(__file__).resolve().parents[1]
NOT_TAKEN = ("padded-split: vLLM 0.33.0 refused it at allocate_kv_cache: ValueError: no; mla-indexer: none of its "
             "layers holds K and V (layers.0.attn (latent TRITON_MLA))")


def add(folder, release, model, outcome, diagnosis="", repro="", known="", check="model-transfer"):
    results.append(folder, Result(run="r1", release=release, source="live", subject="lmcache-mp", check=check,
                                  geometry=f"model:{model}" if model != "*" else "*", outcome=outcome, case="c",
                                  diagnosis=diagnosis, repro=repro, known=known), "w")


def merged(folder):
    for d in folder.iterdir():
        if d.is_dir():
            results.merge(folder, d.name)


@pytest.fixture
def root(tmp_path):
    folder = tmp_path / "results" / "connectors" / "lmcache-0.5.6"
    for release in ("0.33.0", "0.25.1"):
        add(folder, release, "uniform", "bit-identical")
        add(folder, release, "uniform", "bit-identical")
        add(folder, release, "kernel-split", "bit-identical")
        add(folder, release, "kernel-split", "differs", "8192 of 8192 elements differ",
            f"REPRO model-transfer release={release} model=kernel-split", known="lmcache-mp#1")
        add(folder, release, "sliding", "unsupported", "register_kv_caches: ValueError: multiple groups")
        add(folder, release, "*", "not-applicable", NOT_TAKEN.replace("0.33.0", release))
        add(folder, release, "*", "not-applicable", "lmcache-mp declares connector", check="bit-identity")
    add(folder, "0.33.0", "shared", "subject-error", "ZMQError: Address already in use", "REPRO shared 0.33.0")
    add(folder, "0.33.0", "shared", "bit-identical")
    add(folder, "0.33.0", "kernel-split", "stale", known="lmcache-mp#2")
    add(folder, "0.25.1", "shared", "not-run", "needs vLLM's own classes")
    add(folder, "0.33.0", "cross-layer", "bit-identical")  # 0.25.1's run did not select it (-k)
    merged(folder)
    results.install_error(tmp_path / "results" / "connectors" / "lmcache-0.4.7", "0.33.0",
                          "lmcache 0.4.7: uv pip install --no-deps lmcache==0.4.7 failed")
    return tmp_path / "results"


def test_each_cell_is_one_word_from_its_lines(root):
    by = {t.connector: t for t in connectors.tables(root)}
    t = by["lmcache-0.5.6"]
    assert t.releases == ("0.25.1", "0.33.0") and t.subject == "lmcache-mp"
    # in the order the newest release's allocation record has them
    assert t.models == ("uniform", "kernel-split", "sliding", "padded-split", "shared", "mla-indexer", "cross-layer")
    c = t.cells
    assert c["uniform", "0.33.0"] == connectors.Compatibility("green")
    # a failing line makes the cell red whatever passed beside it, with its outcome, words, REPRO and known finding;
    # a stale line is the report's to say
    assert c["kernel-split", "0.33.0"] == connectors.Compatibility(
        "red", "differs: 8192 of 8192 elements differ", "REPRO model-transfer release=0.33.0 model=kernel-split",
        "lmcache-mp#1")
    assert c["shared", "0.33.0"].word == "red" and c["shared", "0.33.0"].repro == "REPRO shared 0.33.0"
    assert c["sliding", "0.25.1"] == connectors.Compatibility("unsupported",
                                                              "register_kv_caches: ValueError: multiple groups")
    assert c["shared", "0.25.1"] == connectors.Compatibility("not run", "not-run: needs vLLM's own classes")
    assert c["padded-split", "0.25.1"] == connectors.Compatibility(
        "not taken", "vLLM 0.25.1 refused it at allocate_kv_cache: ValueError: no")
    assert c["cross-layer", "0.25.1"] == connectors.Compatibility("not run",
                                                                  "no result line of it (not selected in the run)")
    assert c["mla-indexer", "0.33.0"].detail == "none of its layers holds K and V (layers.0.attn (latent TRITON_MLA))"
    # a package release that did not install is a cell that says so, never a pass
    assert by["lmcache-0.4.7"].cells == {(connectors.EVERY, "0.33.0"): connectors.Compatibility(
        "not installable", "lmcache 0.4.7: uv pip install --no-deps lmcache==0.4.7 failed")}


def test_a_release_that_did_not_install_reads_not_installable_in_every_model_it_has(tmp_path, root):
    folder = root / "connectors" / "lmcache-0.5.6"
    results.install_error(folder, "0.26.0", "lmcache 0.5.6: uv pip install --no-deps lmcache==0.5.6 failed")
    t = next(t for t in connectors.tables(root) if t.connector == "lmcache-0.5.6")
    assert {t.cells[m, "0.26.0"].word for m in t.models} == {"not installable"}
    assert t.cells["uniform", "0.26.0"].detail.endswith("uv pip install --no-deps lmcache==0.5.6 failed")


def test_the_report_ends_with_the_table_in_markdown_and_html(root, tmp_path):
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "NO CONFORMANCE RESULTS: only connector results (nox -s connectors), under Connectors" in md
    table = md[md.index("### lmcache-0.5.6 (`lmcache-mp`)"):]
    assert "| model | 0.25.1 | 0.33.0 |" in table
    assert "| kernel-split | red (lmcache-mp#1) | red (lmcache-mp#1) |" in table
    assert "| sliding | unsupported | unsupported |" in table
    assert ("- red (shared on 0.33.0): subject-error: ZMQError: Address already in use `REPRO shared 0.33.0`"
            in table)
    assert "- unsupported (sliding on 0.25.1, sliding on 0.33.0): `register_kv_caches: ValueError: multiple groups`" \
        in table
    page = (tmp_path / "out" / "report.html").read_text()
    assert '<section id="connectors">' in page and '<td class="not-taken">not taken</td>' in page
    assert page.index('<section id="connectors">') < page.index("</body>")


def test_a_folder_without_connector_results_has_no_table(tmp_path):
    assert connectors.tables(tmp_path) == []
    assert connectors.main([str(tmp_path)]) == 1


def test_the_table_prints_from_a_results_folder(root):
    done = subprocess.run([sys.executable, "-m", "harness.report.connectors", str(root)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("### lmcache-0.4.7\n\n| model | 0.33.0 |\n|---|---|\n| every model | not "
                                  "installable |")
    assert "| uniform | green | green |" in done.stdout
