"""The performance lane on the CPU: its judging (band, threshold, known and stale findings, cells it cannot time)
over real splits and launches of tiny workloads, with a scripted timer in place of CUDA events (a CPU's interpreted
kernel time says nothing of a compiled one's, and a test never judges a wall-clock time)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the first triton import

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from harness import performance  # noqa: E402
from harness.draws.cases import Case  # noqa: E402
from harness.results import findings, timings
from harness.results.findings import FindingsError, KnownPerformance, SlowFinding  # noqa: E402
from harness.results.timings import NOT_TIMED, SLOWER, STALE, WITHIN, Timing  # noqa: E402
from harness.run.releases import load_release  # noqa: E402
from harness.subjects.builtin import BuiltinSubject  # noqa: E402
from kvconform import bench  # noqa: E402
from kvconform.subjects import load_subject  # noqa: E402
from kvconform.subjects.mutants import mutant_subject  # noqa: E402
from kvconform.subjects.slow import ContiguousViews  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ROOT / "fixtures" / "contracts"
TINY = {"decode tiny": Case((1, 1), (40, 20), 2, 1, 64, 16), "prefill tiny": Case((16,), (16,), 2, 1, 64, 16)}
NONE = KnownPerformance(timings.THRESHOLD, ())
RATES = performance.Rates(copy=1e12, matmul=1e14)


def releases(*names):
    return [load_release(n, CONTRACTS) for n in names]


def scripted(paged: float = 1.0, dense=(1.0,)):
    """A timer that runs each call once (so that the real launch happens) and returns scripted milliseconds: every
    paged repeat `paged`, the dense runs' repeats in turn from `dense`."""
    runs = iter(dense * 100)

    def timer(fn, repeats, what):
        fn()
        if what.startswith("paged"):
            return [paged] * repeats
        return [next(runs)] * repeats
    return timer


def lane(subject, rels, timer, known=NONE, workloads=None, conformance_known=()):
    return performance.lane(subject, rels, workloads or {"decode tiny": TINY["decode tiny"]}, known,
                            conformance_known, timer, RATES, "run-1", "cpu", say=lambda _: None)


def test_band_and_limit():
    assert timings.band([1.0, 1.02, 0.99]) == pytest.approx(1.02 / 0.99 - 1)
    assert timings.limit(1.10, 0.02) == 1.10 and timings.limit(1.10, 0.25) == 1.25
    with pytest.raises(ValueError, match="2 positive"):
        timings.band([1.0])


def test_every_geometry_of_the_releases_is_timed_once_with_a_line_per_release():
    lines = lane(BuiltinSubject(), releases("0.8.5.post1", "0.11.2"), scripted())
    by_geometry = {}
    for x in lines:
        by_geometry.setdefault(x.geometry, []).append(x.release)
    # 0.8.5.post1 hands kv-first and blocks-first; 0.11.2 those and their other orders and fp8
    assert by_geometry["kv-first:KV.B.N.H.D"] == ["0.8.5.post1", "0.11.2"]
    assert "blocks-first:B.KV.N.H.D@fp8_e4m3" in by_geometry
    assert not any(g.startswith("latent") for g in by_geometry)
    assert {x.outcome for x in lines} == {WITHIN} and all(x.ratio == 1.0 and x.repeats == timings.REPEATS
                                                           for x in lines)


def test_a_ratio_beyond_the_threshold_is_a_new_finding_and_a_known_entry_makes_it_known():
    rels = releases("0.8.5.post1")
    slow = lane(BuiltinSubject(), rels, scripted(paged=1.2))
    assert {x.outcome for x in slow} == {SLOWER} and all(x.new_finding for x in slow)
    known = KnownPerformance(1.10, (SlowFinding("builtin#perf1", "*", "kv-first:*", "decode *", "pinned*", "r", "l"),))
    judged = {x.geometry: x for x in lane(BuiltinSubject(), rels, scripted(paged=1.2), known) if x.outcome != STALE}
    assert judged["kv-first:KV.B.N.H.D"].known == "builtin#perf1" and not judged["kv-first:KV.B.N.H.D"].new_finding
    assert judged["blocks-first:B.KV.N.H.D"].new_finding  # outside the entry's glob


def test_the_band_of_the_dense_runs_widens_the_limit():
    # dense medians spread 1.0 .. 1.3: a 1.2 ratio is within that noise, a 1.4 one beyond it
    noisy = (1.0, 1.3, 1.1, 1.2, 1.0)
    within = lane(BuiltinSubject(), releases("0.8.5.post1"), scripted(paged=1.1 * 1.2, dense=noisy))
    assert {x.outcome for x in within} == {WITHIN} and within[0].band == pytest.approx(0.3)
    beyond = lane(BuiltinSubject(), releases("0.8.5.post1"), scripted(paged=1.1 * 1.4, dense=noisy))
    assert {x.outcome for x in beyond} == {SLOWER}


def test_a_known_finding_that_did_not_happen_is_stale():
    known = KnownPerformance(1.10, (SlowFinding("builtin#perf1", "*", "*", "decode *", "*", "paging", "l"),))
    lines = lane(BuiltinSubject(), releases("0.8.5.post1"), scripted(paged=1.0), known)
    stale = [x for x in lines if x.outcome == STALE]
    assert [(x.known, x.release) for x in stale] == [("builtin#perf1", "0.8.5.post1")]
    assert "none of 2 covered cells" in stale[0].diagnosis


def test_a_subject_whose_paged_output_differs_is_not_timed_and_that_is_a_new_finding():
    lines = lane(mutant_subject("table_row"), releases("0.8.5.post1"), scripted(),
                 workloads={"decode tiny": Case((1, 1, 1), (40, 20, 30), 2, 1, 64, 16)})
    assert {x.outcome for x in lines} == {NOT_TIMED} and all(x.new_finding for x in lines)
    assert all("bit-identity says differs" in x.diagnosis for x in lines)


class SwappedSplit(BuiltinSubject):
    name = "swapped-split"

    def split(self, kv_cache, layer):
        k, v = super().split(kv_cache, layer)
        return v, k


def test_a_split_that_is_not_the_contracts_views_is_not_timed_and_a_known_conformance_finding_says_so():
    rels = releases("0.8.5.post1")
    lines = lane(SwappedSplit(), rels, scripted())
    assert {x.outcome for x in lines} == {NOT_TIMED}
    assert all("split-agrees says differs" in x.diagnosis and x.new_finding for x in lines)
    known = (findings.Finding("swapped-split#1", "*", "*", "*", "split-agrees", "differs", "swapped", "l"),)
    assert all(x.known == "swapped-split#1" for x in lane(SwappedSplit(), rels, scripted(), conformance_known=known))


def test_modelopt_on_a_release_without_its_layout_api_is_not_timed_as_its_known_finding_predicts():
    pytest.importorskip("modelopt")
    subject = load_subject("modelopt")
    lines = lane(subject, releases("0.33.0"), scripted(), findings.load_performance("modelopt"),
                 workloads={"prefill tiny": TINY["prefill tiny"]}, conformance_known=findings.load("modelopt"))
    assert lines and {(x.outcome, x.known) for x in lines} == {(NOT_TIMED, "modelopt#1"), (NOT_TIMED, "modelopt#9")}


def test_a_dense_forward_that_raises_leaves_its_cells_not_timed_with_the_subjects_words():
    pytest.importorskip("modelopt")
    subject = load_subject("modelopt")  # over an NVFP4 cache it is handed uint8 pages as K/V: its forwards raise
    lines = lane(subject, releases("0.25.1"), scripted(), findings.load_performance("modelopt"),
                 workloads={"prefill tiny": TINY["prefill tiny"]}, conformance_known=findings.load("modelopt"))
    nvfp4 = [x for x in lines if x.cache_dtype == "nvfp4"]
    assert nvfp4 and {(x.outcome, x.known) for x in nvfp4} == {(NOT_TIMED, "modelopt#13")}
    assert all("dense forward: ValueError: q/k/v dtypes differ" in x.diagnosis for x in nvfp4)
    assert {x.outcome for x in lines if x.cache_dtype == "auto" and x.outcome != STALE} == {WITHIN}


def test_the_planted_slow_subject_copies_its_views_and_stays_bit_identical(monkeypatch):
    case = TINY["decode tiny"]
    rels = releases("0.11.2")
    copies = []
    clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: copies.append(tuple(t.shape)) or clone(t, *a, **k))
    lines = lane(ContiguousViews(), rels, scripted(), workloads={"decode tiny": case})
    assert {x.outcome for x in lines} == {WITHIN}  # bit-identical to dense: only time tells it apart
    blocks = case.blocks_needed() + performance.SPARE_PAGES
    assert (blocks, case.block_size, case.kv_heads, case.head_dim) in copies  # a whole side of the cache, per call


def test_lines_are_written_per_release_replacing_only_the_subjects_timed(tmp_path):
    line = Timing(run="r", release="0.8.5.post1", source="replay", subject="builtin", geometry="g", workload="w",
                  tile="pinned", outcome=WITHIN, ratio=1.0)
    other = Timing(**{**line.__dict__, "subject": "modelopt"})
    timings.write(tmp_path, [line, other])
    timings.write(tmp_path, [Timing(**{**line.__dict__, "ratio": 1.5, "outcome": SLOWER})])
    read = timings.read(tmp_path)
    assert sorted((x.subject, x.outcome) for x in read) == [("builtin", SLOWER), ("modelopt", WITHIN)]
    (tmp_path / "0.8.5.post1" / timings.FILE).write_text(json.dumps({"schema": 1, "outcome": "faster"}) + "\n")
    with pytest.raises(ValueError, match=r"0.8.5.post1/performance.jsonl:1: not a performance line"):
        timings.read(tmp_path)


def test_known_performance_findings_read_and_refused(tmp_path):
    (tmp_path / "s.toml").write_text('performance_threshold = 1.05\n[[performance]]\nreleases = ">=0.26"\n'
                                     'geometry = "packed:*"\nworkload = "decode *"\ntile = "*"\nreason = "r"\n'
                                     'link = "l"\n')
    known = findings.load_performance("s", tmp_path)
    assert known.threshold == 1.05 and known.known("0.28.0", "packed:B.N.H.C", "decode x", "pinned").id == "s#perf1"
    assert known.known("0.25.1", "packed:B.N.H.C", "decode x", "pinned") is None
    assert findings.load_performance("absent", tmp_path) == KnownPerformance(timings.THRESHOLD, ())
    (tmp_path / "t.toml").write_text("performance_threshold = 0.9\n")
    with pytest.raises(FindingsError, match=r"t.toml: performance_threshold 0.9 is not a ratio >= 1.0"):
        findings.load_performance("t", tmp_path)
    (tmp_path / "u.toml").write_text('[[performance]]\nreleases = "*"\ngeometry = "*"\n')
    with pytest.raises(FindingsError, match=r"u.toml performance 1: keys"):
        findings.load_performance("u", tmp_path)


def test_the_shipped_known_performance_findings_read():
    assert [f.id for f in findings.load_performance("builtin").findings] == ["builtin#perf1"]
    assert [f.id for f in findings.load_performance("modelopt").findings] == ["modelopt#perf1"]


def test_bench_refuses_to_time_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CPU-only test")
    assert bench.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_bench_table_names_the_worst_cell_per_release_and_workload():
    cell = dict(run="r", source="replay", subject="builtin", workload="decode 64x4k fp16", tile="pinned",
                threshold=1.1)
    lines = [Timing(**cell, release="0.28.0", geometry="packed:B.N.H.C", outcome=WITHIN, ratio=1.01),
             Timing(**cell, release="0.28.0", geometry="packed:B.H.N.C", outcome=SLOWER, ratio=1.3, known="b#perf1"),
             Timing(**cell, release="0.33.0", geometry="packed:B.H.N.C", outcome=NOT_TIMED, diagnosis="why")]
    rows = bench.table(lines)
    assert "1.300x" in rows[1] and "packed:B.H.N.C; within 1, slower [known] 1" in rows[1]
    assert rows[2].split()[:2] == ["0.33.0", "decode"] and "not-timed 1" in rows[2]
