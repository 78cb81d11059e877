"""benchmarks/kill_power.py counts an item as caught only on a new finding, flags what checked nothing, and names each
item caught on one side only, and keeps each run's stored regressions to itself."""

import os
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import kill_power  # noqa: E402



def _row(outcome, known="", geometry="g", check="split-agrees"):
    return SimpleNamespace(release="0.22.1", geometry=geometry, check=check, outcome=outcome, known=known,
                           diagnosis="why")


def test_caught_is_a_new_finding_and_a_harness_error_checks_nothing():
    rows = [_row("bit-identical"), _row("differs", geometry="a"), _row("differs", known="k1", geometry="b"),
            _row("accepted", geometry="c", check="rejects-malformed"), _row("unsupported", geometry="d"),
            _row("harness-error", geometry="e")]
    found, broken = kill_power.caught(rows)
    assert found == ["0.22.1|a|split-agrees", "0.22.1|c|rejects-malformed"]
    assert broken == ["0.22.1|e|split-agrees: harness-error: why"]


def test_compare_names_each_item_lost_and_gained():
    before = {"s": {"caught": ["r|a|c", "r|b|c"]}}
    after = {"s": {"caught": ["r|b|c", "r|d|c"]}}
    lines, differences = kill_power.compare(before, after)
    assert differences == 2
    assert "  lost   s r|a|c" in lines and "  gained s r|d|c" in lines
    assert kill_power.compare(before, before)[1] == 0


def test_a_run_stores_its_regressions_in_its_own_folder_not_the_checkouts(tmp_path, monkeypatch):
    """A mutant is kvconform's own subject: without this its shrunk examples would land in fixtures/regressions and
    run first in every later run, the other side's included."""
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        return SimpleNamespace(returncode=0, stdout="1 passed\n", stderr="")

    monkeypatch.setattr(kill_power.subprocess, "run", fake_run)
    monkeypatch.setattr(kill_power.results, "read", lambda *a, **k: [])
    kill_power.run(tmp_path / "root", "mutant:table_row", kill_power.KERNEL, tmp_path / "out", 2)
    assert f"--kvconform-regressions-dir={tmp_path / 'out' / 'mutant_table_row' / 'regressions'}" in seen["cmd"]


def test_a_setting_names_its_releases_and_budget_and_hides_the_gpu_only_on_the_cpu(tmp_path):
    cpu = kill_power.Setting()
    assert cpu.args() == ["--kvconform-release=recorded"]
    assert cpu.env(tmp_path)["TRITON_INTERPRET"] == "1" and cpu.env(tmp_path)["CUDA_VISIBLE_DEVICES"] == ""
    gpu = kill_power.Setting("cuda", ("0.22.1", "0.33.0"), 300)
    assert gpu.args() == ["--kvconform-release=0.22.1", "--kvconform-release=0.33.0", "--kvconform-max-examples=300"]
    env = gpu.env(tmp_path)
    assert env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    assert env.get("TRITON_INTERPRET") == os.environ.get("TRITON_INTERPRET")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "examples"), str(tmp_path / "tests")]
