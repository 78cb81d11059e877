"""The report folds results into a release x geometry matrix and never merges outcome words."""

import json

from harness import report, results
from harness.results import Result


def add(root, release, geometry, outcome, check="bit-identity", known="", source="replay", diagnosis=""):
    results.append(root, Result(release, source, "builtin", geometry, check, "none", outcome, case="c",
                                diagnosis=diagnosis, known=known), "w")


def build(tmp_path):
    root = tmp_path / "results"
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "bit-identical")
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "differs", diagnosis="1 of 8 differ")
    add(root, "0.9.2", "blocks-first:B.KV.N.H.D", "unsupported", diagnosis="head_dim 80")
    add(root, "0.30.0", "kv-first:KV.B.N.H.D", "contract-error", known="builtin#1")
    add(root, "0.30.0", "kv-first:KV.B.N.H.D", "harness-error")
    add(root, "0.30.0", "kv-first:KV.B.N.H.D", "stale", check="split-agrees", known="builtin#2")
    add(root, "0.8.5.post1", "*", "install-error", check="install", source="install")
    add(root, "main", "packed:B.H.N.C", "skipped", check="vllm-write")
    for release in ("0.9.2", "0.30.0", "0.8.5.post1", "main"):
        results.merge(root, release)
    return root


def test_matrix_keeps_every_outcome_word_apart(tmp_path):
    data = report.fold(results.read(build(tmp_path)))
    assert data["releases"] == ["0.8.5.post1", "0.9.2", "0.30.0", "main"]
    cell = data["matrix"]["builtin"]["0.9.2"]["blocks-first:B.KV.N.H.D"]
    assert cell == {"differs": 1, "unsupported": 1, "bit-identical": 1}  # worst first
    cell = data["matrix"]["builtin"]["0.30.0"]["kv-first:KV.B.N.H.D"]
    assert cell == {"harness-error": 1, "contract-error [known]": 1, "stale": 1}
    assert data["matrix"]["builtin"]["0.8.5.post1"]["*"] == {"install-error": 1}
    assert data["matrix"]["builtin"]["main"]["packed:B.H.N.C"] == {"skipped": 1}


def test_new_known_and_stale_findings_are_listed_apart(tmp_path):
    data = report.fold(results.read(build(tmp_path)))
    assert sorted(r["outcome"] for r in data["new_findings"]) == ["differs", "harness-error", "install-error"]
    assert [k["id"] for k in data["known_findings"]] == ["builtin#1"]
    assert [s["known"] for s in data["stale_findings"]] == ["builtin#2"]
    assert data["unsupported"] == [{"subject": "builtin", "reason": "head_dim 80", "count": 1}]


def test_command_writes_markdown_and_json(tmp_path):
    root = build(tmp_path)
    assert report.main([str(root), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# kvconform conformance report\n\n**RED**: 3 new finding(s), 1 known, 1 stale")
    assert "| 0.9.2 | **differs** 1 · unsupported 1 · bit-identical 1 |" in md.replace(" — |", "")
    assert json.loads((tmp_path / "out" / "report.json").read_text())["releases"][0] == "0.8.5.post1"


def test_no_results_is_an_error(tmp_path):
    assert report.main([str(tmp_path)]) == 1
