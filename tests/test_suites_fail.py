"""The conformance suites can fail: a subject that splits blocks-first caches on the wrong axis fails exactly the
blocks-first geometries, each with a shrunk one-line repro that replays the failure; the other family passes.
Known findings turn those failures green-but-reported, and a known finding that does not happen is reported stale.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import recorded
import torch

from harness.contract import families
from harness.draws.strategies import CPU, ambiguous
from harness.handed.layer import contract_of
from harness.recordings.store import save
from harness.subjects.builtin import BuiltinSubject

REPO = Path(__file__).resolve().parent.parent
SUBJECT = "test_suites_fail:WrongAxisForBlocksFirst"


class WrongAxisForBlocksFirst(BuiltinSubject):
    """Treats every cache as kv-first: unbinds axis 0, which for blocks-first (B, KV, N, H, D) is the block axis."""

    name = "wrong-axis-blocks-first"

    def split(self, kv_cache, layer):
        if contract_of(layer).layout.family == "blocks-first":
            return kv_cache[0], kv_cache[1]
        return super().split(kv_cache, layer)


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("suites")
    by_family = {}
    for c in families():
        by_family.setdefault(c.layout.family, []).append(c)
    # Two eras: one whose release uses blocks-first caches, one with kv-first ones (each with the layout API of a
    # recorded release of that family, under another release's name).
    for name, family, real in (("0.9.0", "blocks-first", "0.25.1"), ("0.30.0", "kv-first", "0.22.1")):
        names = [c.name for c in by_family[family]]
        save(recorded.cut(real, recorded.geometries(real, names), name), root / "contracts")
    return root


def conformance(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
           "KVCONFORM_SUBJECT": SUBJECT}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--hypothesis-profile=kvconform-ci",
           f"--kvconform-contracts-dir={root / 'contracts'}", f"--kvconform-results-dir={root / 'results'}",
           f"--kvconform-regressions-dir={root / 'regressions'}", f"--kvconform-known-findings={root / 'known'}", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def outcomes(out: str) -> dict[str, str]:
    """node id -> PASSED/FAILED/XFAIL/SKIPPED from the `-rA` summary."""
    return {node: word for word, node in re.findall(r"^(PASSED|FAILED|XFAIL|SKIPPED) (\S+)", out, re.M)}


def test_wrong_axis_fails_that_family_only_with_a_replayable_one_line_repro(layout):
    # Split agreement over both physical orders of each family; bit-identity (kernels under the CPU interpreter,
    # and shrinking a failure runs ~100 of them) over the NHD order of each.
    bit = "conformance/test_bit_identity.py::test_bit_identity"
    done = conformance(layout, "conformance/test_split.py", f"{bit}[0.9.0-blocks-first:B.KV.N.H.D]",
                       f"{bit}[0.30.0-kv-first:KV.B.N.H.D]", "--kvconform-release=0.9.0", "--kvconform-release=0.30.0",
                       "--kvconform-max-examples=3", "-rA")
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    seen = outcomes(out)
    split = "conformance/test_split.py::test_split_agrees"
    assert {n for n, w in seen.items() if w == "FAILED"} == {
        f"{bit}[0.9.0-blocks-first:B.KV.N.H.D]", f"{split}[0.9.0-blocks-first:B.KV.N.H.D]",
        f"{split}[0.9.0-blocks-first:B.KV.H.N.D]"}, out[-3000:]
    assert {n for n, w in seen.items() if w == "PASSED"} == {
        f"{bit}[0.30.0-kv-first:KV.B.N.H.D]", f"{split}[0.30.0-kv-first:KV.B.N.H.D]",
        f"{split}[0.30.0-kv-first:KV.B.H.N.D]"}, out[-3000:]
    repros = re.findall(r"^E\s+(REPRO .*)$", out, re.M)
    assert len(repros) == 3
    first = ambiguous(families()[2], CPU)[0]  # the explicit example every split-agrees target runs first
    for line in repros:
        assert "release=0.9.0" in line and "geometry=blocks-first:" in line and "Case(" in line
        # split-agrees fails its first explicit example (2 blocks, 2 KV heads, block size == head dim), which is not
        # shrunk; bit-identity does not run the kernels there (the split does not read the tokens: not-run) and
        # fails a generated example, shrunk to one sequence of a single token.
        if line.startswith("REPRO split-agrees"):
            assert " num_blocks=2 " in line and repr(first.case) in line, line
        else:
            assert "q_lens=(1,), kv_lens=(1,)" in line, line
    # The failing examples were kept as readable regressions; a repro command replays one, ahead of generation.
    kept = sorted((layout / "regressions" / WrongAxisForBlocksFirst.name).glob("*.json"))
    assert len(kept) == 3 and all(json.loads(p.read_text())["geometry"].startswith("blocks-first") for p in kept)
    line = next(r for r in repros if r.startswith("REPRO split-agrees"))
    command = shlex.split(line.split(" :: ", 1)[1])
    assert command[:3] == [sys.executable, "-m", "pytest"], command  # the interpreter that ran: no venv to activate
    again = conformance(layout, *command[3:], "-rA")
    assert again.returncode == 1, again.stdout[-3000:]
    assert list(outcomes(again.stdout).values()) == ["FAILED"], again.stdout[-3000:]
    assert "test_split_agrees_regression[0.9.0-blocks-first" in again.stdout
    rows = [json.loads(x) for p in (layout / "results").glob("*/results.jsonl") for x in p.read_text().splitlines()]
    failing = [r for r in rows if r["outcome"] != "bit-identical"]
    assert failing and all(r["geometry"].startswith("blocks-first") and r["repro"].startswith("REPRO")
                           for r in failing)



def test_known_findings_are_green_but_reported_and_stale_ones_flagged(layout):
    known = layout / "known"
    known.mkdir(exist_ok=True)
    entry = ('[[finding]]\nreleases = "{r}"\ngeometry = "{g}"\nsparsity = "*"\ncheck = "split-agrees"\n'
             'outcome = "{o}"\nreason = "{why}"\nlink = "tests/test_suites_fail.py"\n')
    (known / f"{WrongAxisForBlocksFirst.name}.toml").write_text(
        entry.format(r="<0.10", g="blocks-first:*", o="differs", why="unbinds the block axis") +
        entry.format(r="<0.10", g="blocks-first:*", o="subject-error", why="unbinds the block axis, 1 block") +
        entry.format(r=">=0.30", g="kv-first:*", o="differs", why="no longer happens"))
    done = conformance(layout, "conformance/test_split.py", "--kvconform-release=0.9.0", "--kvconform-release=0.30.0",
                       "--kvconform-max-examples=3", "-rA", f"--kvconform-regressions-dir={layout / 'no-regressions'}",
                       "-n", "2")  # two xdist workers: staleness is decided on their merged results
    out = done.stdout
    assert done.returncode == 0, out[-3000:]
    assert re.search(r"^2 passed, (1 deselected)?2 xfailed", out, re.M), out[-2000:]
    assert "known finding wrong-axis-blocks-first#" in out
    assert "STALE wrong-axis-blocks-first#3" in out
    rows = [json.loads(x) for x in (layout / "results" / "0.30.0" / "results.jsonl").read_text().splitlines()]
    assert [r["known"] for r in rows if r["outcome"] == "stale"] == ["wrong-axis-blocks-first#3"]


class SwapsKVForPacked(BuiltinSubject):
    """Takes the packed halves the wrong way round: V's half as K. Shapes and strides look right; nothing raises."""

    name = "swaps-kv-packed"

    def split(self, kv_cache, layer):
        k, v = super().split(kv_cache, layer)
        return (v, k) if contract_of(layer).layout.family == "packed" else (k, v)


def test_kernel_checks_are_not_run_where_the_split_reads_the_wrong_tokens(tmp_path):
    # Packed and kv-first geometries; the split is wrong for packed only. split-agrees fails there with a shrunk
    # repro; bit-identity and determinism launch no kernel over the wrong views and say why, never passing.
    by_family = {}
    for c in families():
        by_family.setdefault(c.layout.family, []).append(c)
    save(recorded.cut("0.33.0", recorded.geometries("0.33.0", [c.name for c in by_family["packed"]]), "0.27.0"),
         tmp_path / "contracts")
    save(recorded.cut("0.22.1", recorded.geometries("0.22.1", [by_family["kv-first"][0].name]), "0.20.0"),
         tmp_path / "contracts")
    done = conformance(tmp_path, "conformance/test_split.py", "conformance/test_bit_identity.py",
                       "conformance/test_determinism.py", "--kvconform-release=0.27.0", "--kvconform-release=0.20.0",
                       "--kvconform-max-examples=3", "-rA", "-vv", "--kvconform-subject=test_suites_fail:SwapsKVForPacked")
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    seen = dict(re.findall(r"^(conformance/\S+) (PASSED|FAILED|SKIPPED)", out, re.M))
    assert {n for n, w in seen.items() if w == "FAILED"} == {
        f"conformance/test_split.py::test_split_agrees[0.27.0-{c.name}]" for c in by_family["packed"]}, out[-3000:]
    for check in ("bit_identity", "determinism"):
        for c in by_family["packed"]:
            assert seen[f"conformance/test_{check}.py::test_{check}[0.27.0-{c.name}]"] == "SKIPPED", out[-3000:]
        assert seen[f"conformance/test_{check}.py::test_{check}[0.20.0-{by_family['kv-first'][0].name}]"] == "PASSED"
    rows = [json.loads(x) for x in (tmp_path / "results" / "0.27.0" / "results.jsonl").read_text().splitlines()]
    kernel = [r for r in rows if r["check"] in ("bit-identity", "determinism")]
    assert kernel and {r["outcome"] for r in kernel} == {"not-run"}, kernel
    assert all("K view does not read the tokens written through the contract's K view" in r["diagnosis"]
               for r in kernel)


class NondeterministicPaged(BuiltinSubject):
    """Every second paged call moves its first output element by one ULP (as a racy split-KV combine would)."""

    name = "nondeterministic-paged"
    calls = 0

    def paged_forward(self, *args, **kwargs):
        out = super().paged_forward(*args, **kwargs)
        type(self).calls += 1
        if self.calls % 2 == 0:
            out.view(-1).view(torch.int16)[0] += 1  # fp16/bf16 bits: the next representable value
        return out


class UnvalidatedSplit(BuiltinSubject):
    """Takes K and V off the K/V axis without validating the cache first."""

    name = "unvalidated-split"

    def split(self, kv_cache, layer):
        return kv_cache[0], kv_cache[1]


class CausalOffsetMutant:
    """The built-in kernel with its chunked-prefill causal offset off by one (kvconform.subjects.mutants)."""

    def __new__(cls):
        from kvconform.subjects.mutants import mutant_subject

        return mutant_subject("causal_offset")


@pytest.mark.parametrize("subject, suite, failing", [
    ("NondeterministicPaged", "conformance/test_determinism.py::test_determinism[0.30.0-kv-first:KV.B.N.H.D]",
     "determinism"),
    ("UnvalidatedSplit", "conformance/test_malformed.py", "rejects-malformed"),
    # One sparsity mode's item, given all the examples (the oracle's items share them, a third each).
    ("CausalOffsetMutant", "conformance/test_oracle.py::test_oracle[0.30.0-dense-nm]", "oracle"),
])
def test_each_other_check_fails_on_a_broken_subject(layout, subject, suite, failing):
    examples = 9 if failing == "oracle" else 3
    done = conformance(layout, suite, "--kvconform-release=0.30.0", f"--kvconform-max-examples={examples}", "-rA",
                       f"--kvconform-subject=test_suites_fail:{subject}", f"--kvconform-regressions-dir={layout / 'r' / subject}")
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    assert set(outcomes(out).values()) == {"FAILED"}, out[-3000:]
    repros = re.findall(r"^E\s+(REPRO .*)$", out, re.M)
    assert repros and all(r.startswith(f"REPRO {failing} release=0.30.0") for r in repros), out[-3000:]


def test_a_release_without_a_recording_is_a_one_line_usage_error_saying_how_to_add_it(layout):
    done = conformance(layout, "conformance/test_contracts.py", "--kvconform-release=0.99.9", "-rA")
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-3000:]
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "vllm 0.99.9 has no recording" in err[0], err
    assert "add it to kvconform's matrix.toml, then run `nox -s probe -- 0.99.9`" in err[0], err
