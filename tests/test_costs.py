"""Where a run's time goes (harness.device.costs), the benchmark guard over it (benchmarks/bench_suites.py), result
lines written per item, and Triton's interpreter without its dropped overflow checks."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.device import costs, devices
from harness.results import Word
from harness.run.releases import ReleaseContracts
from harness.run.sink import Sink

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_suites", ROOT / "benchmarks" / "bench_suites.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_phases_nest_and_an_item_adds_up_to_its_time():
    ticks = iter(range(0, 1000, 10))  # each reading of the clock 10 s after the last
    clock = costs.Clock(lambda: float(next(ticks)))
    with clock.item("bit-identity"):  # 0
        clock.example()
        with clock.phase("check"):  # 10: drawing 10
            with clock.phase("subject"):  # 20: check 10
                pass  # 30: subject 10
        # 40: check 10 more
    # 50: drawing 10 more
    report = clock.report()["bit-identity"]
    assert report == {"examples": 1, "draw": 20.0, "check": 20.0, "subject": 10.0}
    assert sum(v for k, v in report.items() if k in costs.PHASES) == 50.0  # the item's whole time, once
    with clock.phase("subject"):  # outside an item nothing is charged
        pass
    assert clock.report()["bit-identity"] == report


def test_reports_of_processes_add_up_and_read_per_example():
    a = {"split-agrees": {"examples": 10, "draw": 0.05, "subject": 0.01}}
    b = {"split-agrees": {"examples": 30, "draw": 0.15, "record": 0.04}, "oracle": {"examples": 1, "check": 0.2}}
    merged = costs.merged([a, b])
    assert merged["split-agrees"] == {"examples": 40, "draw": pytest.approx(0.2), "subject": 0.01, "record": 0.04}
    ms = costs.per_example(merged["split-agrees"])
    assert ms["total"] == pytest.approx(6.25) and ms["draw"] == pytest.approx(5.0)
    lines = costs.lines(merged)
    assert lines[0].startswith("cost split-agrees: 40 examples, 0.2 s, 6.25 ms/example (draw 5.00, subject 0.25, ")
    assert lines[1].startswith("cost oracle: 1 examples")


MEASURED = """# Measurements

## 2026-12-02 — bench_suites guard: per-check cost on one H200

| check | ms per example |
|---|---|
| split-agrees | 4.00 |
| bit-identity | 10.0 |

| other | table |
|---|---|
| oracle | 1.0 |
"""


def test_the_guard_reads_the_recorded_table_and_flags_a_check_over_its_limit():
    bench = _bench()
    figures = bench.recorded(MEASURED)
    assert figures == {"split-agrees": 4.0, "bit-identity": 10.0}  # the first table under the heading only
    assert bench.over({"split-agrees": 4.9, "bit-identity": 12.4, "oracle": 99.0}, figures) == []
    slow = bench.over({"split-agrees": 5.1, "bit-identity": 12.4}, figures)
    assert slow == ["split-agrees: 5.10 ms per example, 1.27 x the recorded 4.00 (limit 1.25 x)"]


def test_the_guard_names_what_it_cannot_read():
    bench = _bench()
    with pytest.raises(ValueError, match="measurements.md has no heading naming 'bench_suites guard'"):
        bench.recorded("# Measurements\n\n| split-agrees | 4 |\n")
    with pytest.raises(ValueError, match="'fast' for split-agrees is not ms per example"):
        bench.recorded(MEASURED.replace("| split-agrees | 4.00 |", "| split-agrees | fast |"))


def test_the_guard_reads_the_figures_docs_measurements_records():
    figures = _bench().recorded((ROOT / "docs" / "measurements.md").read_text())
    assert set(figures) == {"split-agrees", "rejects-malformed", "bit-identity", "determinism"}  # not the oracle


def _sink(tmp_path: Path) -> tuple[Sink, ReleaseContracts, Path]:
    sink = Sink(tmp_path, "run1", "run1-gw0", "subject", ())
    r = ReleaseContracts("0.33.0", "replay", ())
    return sink, r, tmp_path / "0.33.0" / "results.run1-gw0.jsonl"


def test_an_items_lines_are_written_together_at_its_end_in_order(tmp_path):
    sink, r, path = _sink(tmp_path)
    with sink.batched():
        for i in range(3):
            sink.write(r, "g", "split-agrees", "none", Word.BIT_IDENTICAL, case=f"c{i}")
        assert not path.exists()
    assert [json.loads(x)["case"] for x in path.read_text().splitlines()] == ["c0", "c1", "c2"]
    assert all(json.loads(x)["time"] for x in path.read_text().splitlines())  # stamped when they happened
    sink.write(r, "*", "drift", "*", Word.BIT_IDENTICAL)  # outside an item: at once
    assert len(path.read_text().splitlines()) == 4 and sink.written == 4


def test_a_flush_inside_an_item_writes_what_is_pending(tmp_path):
    # What a process about to end (a lost device, a hung item) does, so that its culprit line is on disk.
    sink, r, path = _sink(tmp_path)
    with sink.batched():
        sink.write(r, "g", "bit-identity", "none", Word.SUBJECT_ERROR, "the device is unusable", case="c0")
        sink.flush()
        assert json.loads(path.read_text().splitlines()[-1])["case"] == "c0"
    assert len(path.read_text().splitlines()) == 1


@pytest.fixture
def interpreter(monkeypatch):
    """Triton's interpreter module, for a kernel decorated inside the test (it reads TRITON_INTERPRET then)."""
    if torch.cuda.is_available():
        pytest.skip("Triton's interpreter: a CPU-only test")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from triton.runtime import interpreter

    return interpreter


def test_the_interpreter_without_its_overflow_checks_computes_the_same_values(monkeypatch, interpreter):
    import triton
    import triton.language as tl

    @triton.jit
    def wrap(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < n)
        tl.store(out_ptr + i, x * 65537 + 7, mask=i < n)  # int32 overflow: wraps

    x = torch.tensor([1, 40000, -70000, 2**30, -(2**31)], dtype=torch.int32)
    monkeypatch.setattr(interpreter.interpreter_builder, "options", interpreter.interpreter_builder.options)
    checked = torch.empty_like(x)
    assert interpreter.interpreter_builder.options.sanitize_overflow
    wrap[(1,)](x, checked, x.numel(), BLOCK=8)
    devices.unchecked_interpreter()
    assert not interpreter.interpreter_builder.options.sanitize_overflow
    unchecked = torch.empty_like(x)
    wrap[(1,)](x, unchecked, x.numel(), BLOCK=8)
    assert torch.equal(checked, unchecked)
    assert torch.equal(unchecked, (x.long() * 65537 + 7).to(torch.int32))  # two's complement wrap



def test_the_interpreter_patching_its_language_once_per_launch_computes_the_same_values(monkeypatch, interpreter):
    import triton
    import triton.language as tl

    @triton.jit
    def reduce_rows(x_ptr, out_ptr, BLOCK: tl.constexpr, FAIL: tl.constexpr):
        rows, cols = tl.arange(0, BLOCK)[:, None], tl.arange(0, BLOCK)[None, :]
        x = tl.load(x_ptr + rows * BLOCK + cols)
        total = tl.sum(x, axis=1) + tl.max(x, axis=1) + tl.cdiv(BLOCK, 3)  # nested jit calls
        tl.static_assert(FAIL == 0, "planted failure")
        tl.store(out_ptr + tl.arange(0, BLOCK), total)

    patches = []
    patch = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patches.append(fn) or patch(fn))
    monkeypatch.setattr(interpreter._LangPatchScope, "restore", interpreter._LangPatchScope.restore)
    x = torch.randint(-8, 8, (8, 8)).float()  # integers: every summation order is exact

    def launch(fail: int = 0) -> torch.Tensor:
        out = torch.empty(8)
        reduce_rows[(1,)](x, out, BLOCK=8, FAIL=fail)
        return out

    every_call = launch()
    patched_every_call, patches[:] = len(patches), []
    devices.language_patched_once_per_launch()
    once = launch()
    assert torch.equal(every_call, x.sum(1) + x.amax(1) + 3) and torch.equal(once, every_call)
    # the launch's own patching (triton.language), then the first nested call's (triton.language.core, which
    # triton's standard functions read); before, every nested call patched again
    assert patched_every_call > 3 and len(patches) == 2
    with pytest.raises(Exception, match="planted failure"):
        launch(fail=1)
    patches.clear()
    assert torch.equal(launch(), once) and len(patches) == 2  # the failed launch restored its patching: redone


def test_the_interpreter_keeping_shapes_and_numpy_types_computes_the_same_values(monkeypatch, interpreter):
    import triton
    import triton.language as tl
    import triton.language.core as core

    @triton.jit
    def mixed(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
        rows, cols = tl.arange(0, BLOCK)[:, None], tl.arange(0, BLOCK)[None, :]
        x = tl.load(x_ptr + rows * BLOCK + cols).to(tl.float32)  # bf16 in
        y = tl.load(y_ptr + rows * BLOCK + cols).to(tl.float32)  # fp16 in
        s = tl.dot(x, tl.trans(y), input_precision="ieee")
        out = tl.where((rows + cols) % 3 != 0, s, 0.0) + tl.sum(x, axis=1)[:, None]
        tl.store(out_ptr + rows * BLOCK + cols, out.to(tl.bfloat16))

    x, y = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).half()

    def launch() -> torch.Tensor:
        out = torch.empty(16, 16, dtype=torch.bfloat16)
        mixed[(1,)](x, y, out, BLOCK=16)
        return out

    for owner, name in ((core.block_type, "__init__"), (core.tensor, "__init__"), (interpreter, "_get_np_dtype")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    made_anew = core.block_type.__init__
    before = launch()
    devices.language_shapes_kept()
    devices.numpy_types_kept()
    assert core.block_type.__init__.shapes_kept and interpreter._get_np_dtype.kept
    after = launch()
    assert torch.equal(after.view(torch.int16), before.view(torch.int16)) and torch.equal(launch(), after)
    # A shape seen before gives what the language makes of it, whatever the element type and however it is given.
    for element, shape in ((tl.float32, [4, 8]), (tl.float16, [4, 8]), (tl.int1, [core.constexpr(4), 8]),
                           (tl.pointer_type(tl.bfloat16), [4, 8])):
        kept, anew = core.block_type(element, shape), core.block_type.__new__(core.block_type)
        made_anew(anew, element, shape)
        assert (kept == anew and kept.name == anew.name and kept.numel == anew.numel
                and list(core.tensor(None, kept).shape) == list(core.tensor(None, anew).shape))
    assert interpreter._get_np_dtype(core.block_type(tl.bfloat16, [4])) == np.uint16
