"""A subject whose kernel poisons the device ends as one subject-error, named with its REPRO line, for the item that
caused it; the rest of the run goes on in a fresh xdist worker.

On the CPU the fault is simulated: the planted subject raises the error CUDA gives for an illegal address and
makes `harness.device.devices.poisoned` report the device unusable, as a real fault would. On a GPU, `ReadsPastCache`
faults for real: `PYTHONPATH=tests pytest conformance --kvconform-release 0.33.0 --kvconform-subject test_faults:ReadsPastCache`.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import recorded

from harness.device import devices
from harness.handed.layer import contract_of
from harness.recordings.store import save
from harness.subjects.builtin import BuiltinSubject, batch_tensors, launch

REPO = Path(__file__).resolve().parent.parent
GEOMETRIES = recorded.geometries("0.22.1", count=3)
FAULTY = GEOMETRIES[1].name  # one geometry of the recording below; the others must report as usual


class _OnOneGeometry(BuiltinSubject):
    def split(self, kv_cache, layer):
        self.contract = contract_of(layer)
        return super().split(kv_cache, layer)


class FaultsOnOneGeometry(_OnOneGeometry):
    """Fails on FAULTY's geometry the way a kernel reading past its cache does on a GPU (simulated)."""

    name = "faults-on-one-geometry"

    def paged_forward(self, case, q, k_cache, v_cache, paging, tile):
        if self.contract.name == FAULTY:
            error = "CUDA error: an illegal memory access was encountered"
            devices.poisoned = lambda device: f"AcceleratorError: {error}"
            raise RuntimeError(error)
        return super().paged_forward(case, q, k_cache, v_cache, paging, tile)


class ReadsPastCache(_OnOneGeometry):
    """On FAULTY's geometry reads pages 2^24 past the cache (a wrong page stride would): an illegal address on a
    GPU. Correct everywhere else."""

    name = "reads-past-cache"

    def paged_forward(self, case, q, k_cache, v_cache, paging, tile):
        if self.contract.name != FAULTY:
            return super().paged_forward(case, q, k_cache, v_cache, paging, tile)
        table = paging.block_table.to(q.device) + (1 << 24)
        return launch(case, q, k_cache, v_cache, table, tile or self.tile_config(case), batch_tensors(case, q.device))


def test_a_poisoned_device_is_one_subject_error_and_the_run_goes_on(tmp_path):
    geometries = GEOMETRIES
    save(recorded.cut("0.22.1", geometries, "0.20.0"), tmp_path / "contracts")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--hypothesis-profile=kvconform-ci",
           "conformance/test_bit_identity.py", "--kvconform-release=0.20.0", "--kvconform-max-examples=2", "-n", "2",
           "--kvconform-subject=test_faults:FaultsOnOneGeometry", f"--kvconform-contracts-dir={tmp_path / 'contracts'}",
           f"--kvconform-results-dir={tmp_path / 'results'}", f"--kvconform-regressions-dir={tmp_path / 'regressions'}",
           f"--kvconform-known-findings={tmp_path / 'known'}"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    node = "conformance/test_bit_identity.py::test_bit_identity"
    failed = set(re.findall(r"^FAILED (\S+)", done.stdout, re.M))
    assert failed == {f"{node}[0.20.0-{FAULTY}]"}, out[-4000:]
    passed = set(re.findall(r"^PASSED (\S+)", done.stdout, re.M))
    assert passed == {f"{node}[0.20.0-{c.name}]" for c in geometries if c.name != FAULTY}, out[-4000:]
    assert "crashed while running" in out and "replacing crashed worker" in out, out[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "results" / "0.20.0" / "results.jsonl").read_text().splitlines()]
    faults = [r for r in rows if r["outcome"] != "bit-identical"]
    assert len(faults) == 1 and faults[0]["geometry"] == FAULTY and faults[0]["outcome"] == "subject-error", faults
    assert "the device is unusable after this call" in faults[0]["diagnosis"]
    assert faults[0]["repro"].startswith(f"REPRO bit-identity release=0.20.0 (replay) geometry={FAULTY}")
    assert faults[0]["repro"] in out  # printed by the worker before it ended
    assert {r["geometry"] for r in rows if r["outcome"] == "bit-identical"} == {
        c.name for c in geometries if c.name != FAULTY}
