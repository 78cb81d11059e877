"""A hang ends its item as a `timeout` (a harness limit naming the item and the seconds), never as a verdict, and the
run exits non-zero: through the alarm where the hang is in Python, through the watchdog where it never returns."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import recorded

from harness import results
from harness.recordings.store import save
from harness.subjects.builtin import BuiltinSubject

REPO = Path(__file__).resolve().parent.parent
NODE = "conformance/test_bit_identity.py::test_bit_identity"


class Hangs(BuiltinSubject):
    """Its paged forward never returns (sleeps)."""

    name = "hangs"

    def paged_forward(self, *args):
        time.sleep(3600)


class HangsBeyondReach(BuiltinSubject):
    """Its paged forward never returns to where a signal handler could run (the alarm is blocked), as a hung device
    wait would."""

    name = "hangs-beyond-reach"

    def paged_forward(self, *args):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)


def _run(tmp_path, subject: str, timeout: float) -> subprocess.CompletedProcess:
    save(recorded.cut("0.22.1", recorded.geometries("0.22.1", count=1), "0.20.0"), tmp_path / "contracts")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--hypothesis-profile=kvconform-ci",
           NODE, "--kvconform-release=0.20.0", "--kvconform-max-examples=2", f"--kvconform-timeout={timeout:g}",
           f"--kvconform-subject=test_limits:{subject}", f"--kvconform-contracts-dir={tmp_path / 'contracts'}",
           f"--kvconform-results-dir={tmp_path / 'results'}", f"--kvconform-regressions-dir={tmp_path / 'regressions'}",
           f"--kvconform-known-findings={tmp_path / 'known'}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_hanging_subject_ends_its_item_as_a_timeout(tmp_path):
    done = _run(tmp_path, "Hangs", 3)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    item = f"{NODE}[0.20.0-{recorded.geometries('0.22.1', count=1)[0].name}]"
    # The timeout names the item as a command takes it (quoted: pasted after `pytest`, it runs that item).
    assert f"timeout: '{item}' ran past its limit of 3 s" in out and f"FAILED {item}" in out, out[-3000:]
    rows = results.read(tmp_path / "results")
    assert [r.outcome for r in rows] == ["timeout"], rows
    assert item in rows[0].diagnosis and "3 s" in rows[0].diagnosis and rows[0].repro.startswith("REPRO bit-identity")


def test_a_hang_the_alarm_cannot_reach_ends_the_process(tmp_path):
    start = time.perf_counter()
    done = _run(tmp_path, "HangsBeyondReach", 2)
    out = done.stdout + done.stderr
    assert done.returncode == 3 and time.perf_counter() - start < 120, out[-3000:]
    assert "did not return within 2 s more: this process is ended" in out, out[-3000:]
    rows = results.read(tmp_path / "results", files="results.*.jsonl")  # the process ended before its merge
    assert [r.outcome for r in rows] == ["timeout"] and NODE in rows[0].diagnosis, rows
