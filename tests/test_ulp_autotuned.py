"""The ulp-autotuned check (harness.checks.ulp_autotuned): its rounding bound as the module derives it, and the
check in the suites: a subject whose autotuned paged forward lands beyond the bound is a new finding (differs), one
inside it is within-tolerance, and a subject that declares no `autotune` gets a not-applicable line, never a pass.
The planted subjects here are the built-in kernel (Triton's interpreter, tiny shapes) declaring `autotune`; on CUDA,
AutotunedSwapsKV plants a bug in modelopt's autotuned path alone."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.checks import ulp_autotuned as ulp_check
from harness.draws.cases import Case
from harness.handed.cache import read
from harness.subjects.builtin import BuiltinSubject
from kvconform.subjects.modelopt import ModeloptSubject

REPO = Path(__file__).resolve().parent.parent
ITEM = "conformance/test_ulp_autotuned.py::test_ulp_autotuned[0.25.1-blocks-first:B.KV.N.H.D]"


class AutotunedSwapsKV(ModeloptSubject):
    """modelopt with a bug planted in its autotuned path alone: unpinned (`tile` None), its paged call reads K from
    the V view and V from the K view. The pinned lane (bit-identity) never meets it; ulp-autotuned must catch it.
    It needs modelopt's autotuner (CUDA): `--kvconform-subject test_ulp_autotuned:AutotunedSwapsKV`."""

    name = "modelopt-autotuned-swaps-kv"

    def paged_forward(self, case, q, k_cache, v_cache, paging, tile):
        if tile is None:
            k_cache, v_cache = v_cache, k_cache
        return super().paged_forward(case, q, k_cache, v_cache, paging, tile)


class Nudged(BuiltinSubject):
    """The built-in kernel declaring `autotune`: unpinned, its paged output's first element is moved `by` times the
    check's tolerance for the example, plus `ulps` steps of its dtype."""

    name = "nudged"
    capabilities = frozenset({"split", "forward", "autotune"})
    by, ulps = 0.0, 0

    def autotune_configs(self, case):
        return (self.tile_config(case),)

    def paged_forward(self, case, q, k_cache, v_cache, paging, tile):
        out = super().paged_forward(case, q, k_cache, v_cache, paging, tile)
        if tile is None:
            k, v = read(k_cache, v_cache, paging)
            tol = ulp_check.tolerance(case, q, k, v, min(t.block_n for t in self.autotune_configs(case)))
            first = out.view(-1)[:1]
            moved = (first.double() + self.by * tol).to(out.dtype)
            for _ in range(self.ulps):
                moved = torch.nextafter(moved, torch.full_like(moved, math.inf))
            first.copy_(moved)
        return out


class Beyond(Nudged):
    """Four steps past the bound."""

    name = "nudged-beyond"
    by, ulps = 1.0, 4


class Within(Nudged):
    """Half the bound."""

    name = "nudged-within"
    by = 0.5


def _suites(tmp: Path, subject: str, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The ulp-autotuned suite for `subject` over the recording of 0.25.1 in a fresh process; its result lines."""
    (tmp / "known").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--hypothesis-profile=kvconform-ci",
           f"--kvconform-subject={subject}", "--kvconform-release=0.25.1", "--kvconform-backend=FLASH_ATTN",
           "--kvconform-cache-dtype=auto", "--kvconform-max-examples=1", f"--kvconform-results-dir={tmp / 'results'}",
           f"--kvconform-regressions-dir={tmp / 'regressions'}", f"--kvconform-known-findings={tmp / 'known'}", *args]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for f in (tmp / "results").glob("*/results.jsonl") for line in f.read_text().splitlines()]
    return done, [r for r in rows if r["check"] == "ulp-autotuned"]


def test_the_bound_is_the_documented_one():
    # The module docstring's figures: fp16 and bf16 at n = 8192, D = 128, BLOCK_N 32, R = 16.
    assert 2 * ulp_check.bound(torch.float16, 8192, 128, 32, 16.0) == pytest.approx(7.67e-3, rel=1e-3)
    assert 2 * ulp_check.bound(torch.bfloat16, 8192, 128, 32, 16.0) == pytest.approx(2.805e-2, rel=1e-3)
    # Few keys: the dtype's three roundings dominate.
    u = 2.0**-11
    assert 3 * u < ulp_check.bound(torch.float16, 100, 64, 64, 8.0) < 3.5 * u
    assert ulp_check.gamma(1000) == pytest.approx(1000 * 2.0**-24, rel=1e-4)
    with pytest.raises(ValueError, match="no fp32 rounding bound"):
        ulp_check.gamma(2**24)


def test_the_bound_grows_with_keys_and_tiles_and_scores():
    def b(**kw):
        return ulp_check.bound(**{"dtype": torch.float16, "keys": 1024, "head_dim": 128, "block_n": 32,
                                  "reach": 8.0, **kw})

    assert b(keys=4096) > b() and b(block_n=16) > b() > b(block_n=128) and b(reach=32.0) > b()
    assert b(dtype=torch.bfloat16) > b()


def test_the_tolerance_scales_with_v_and_takes_the_longest_row():
    case = Case((1, 3), (20, 90), 4, 2, 64, 16)
    q, k, v = case.inputs()
    tol = ulp_check.tolerance(case, q, k, v, 64)
    reach = case.scale * float(q.float().norm(dim=-1).max()) * float(k.float().norm(dim=-1).max())
    assert tol == pytest.approx(2 * ulp_check.bound(torch.float16, 90, 64, 64, reach) * float(v.abs().max()))
    assert ulp_check.tolerance(case, q, k, v * 2, 64) == pytest.approx(2 * tol, rel=1e-3)


def test_a_paged_output_beyond_the_bound_is_a_new_finding(tmp_path):
    done, rows = _suites(tmp_path, "test_ulp_autotuned:Beyond", ITEM)
    out = done.stdout
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    assert re.search(r"^FAILED .*test_ulp_autotuned\[0\.25\.1-blocks-first:B\.KV\.N\.H\.D\]", out, re.M), out[-3000:]
    assert re.search(r"^E\s+REPRO ulp-autotuned release=0\.25\.1 \(replay\) geometry=blocks-first:B\.KV\.N\.H\.D", out,
                     re.M), out[-3000:]
    assert rows and rows[-1]["outcome"] == "differs" and not rows[-1]["known"], rows
    assert "1 of " in rows[-1]["diagnosis"] and "elements beyond" in rows[-1]["diagnosis"], rows[-1]
    assert {r["sparsity"] for r in rows} == {"none"}


def test_a_paged_output_within_the_bound_is_within_tolerance(tmp_path):
    done, rows = _suites(tmp_path, "test_ulp_autotuned:Within", ITEM, "-v")  # -v after -q: the header is shown
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(rows) == 3 and {r["outcome"] for r in rows} == {"within-tolerance"}, rows  # 2 explicit + 1 drawn
    # The header states the examples the item draws: one sparsity mode's share of --kvconform-max-examples=1.
    assert "ulp-autotuned 1 + 2 explicit (sparsity mode none only)" in done.stdout, done.stdout[-3000:]
    assert all("max ULP distance" in r["diagnosis"] and "tolerance" in r["diagnosis"] for r in rows), rows
    assert {r["sparsity"] for r in rows} == {"none"}


def test_a_subject_without_autotune_gets_a_not_applicable_line(tmp_path):
    done, rows = _suites(tmp_path, "builtin", "conformance/test_ulp_autotuned.py")
    assert "FAILED" not in done.stdout and "PASSED" not in done.stdout, done.stdout[-3000:]
    assert [(r["outcome"], r["geometry"]) for r in rows] == [("not-applicable", "*")], rows
    assert "missing autotune" in rows[0]["diagnosis"], rows[0]
