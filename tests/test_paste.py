"""Every command kvconform prints runs as printed from a host project: with kvconform installed non-editable (its
suites are `kvconform.suites` in site-packages, no checkout on the path), a failing gallery consumer's REPRO line
and its shrink command, pasted into a shell in the project, each run exactly the one item they name, reproduce the
failure, and keep the run's options (its results folder). A failing run's output stays readable: the first new
findings in full, the later ones by their finding and REPRO line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from envs import one_build_at_a_time, venv_seeing_these_packages

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A throwaway project and a venv (this one's packages, kvconform not among them) with kvconform installed from
    the checkout, non-editable."""
    root = tmp_path_factory.mktemp("host")
    venv_seeing_these_packages(root / "env")
    with one_build_at_a_time(tmp_path_factory):
        subprocess.run([str(root / "env" / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", str(REPO)], check=True, capture_output=True)
    (root / "project").mkdir()
    return root


def _shell(host: Path, command: str) -> subprocess.CompletedProcess:
    script = f". {shlex.quote(str(host / 'env' / 'bin' / 'activate'))}\n{command}"
    env = {**os.environ, "PYTHONPATH": str(REPO / "examples")}  # the gallery consumers, as the README runs them
    return subprocess.run(["bash", "-c", script], cwd=host / "project", capture_output=True, text=True, env=env,
                          timeout=900)


def _ran(out: str) -> list[tuple[str, str]]:
    return re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", out, re.M)


def test_printed_commands_paste_from_a_host_project(host):
    results = host / "project" / "out"
    done = _shell(host, "python -m pytest -p no:cacheprovider -rA --pyargs kvconform.suites "
                        "--kvconform-subject=breakages.flexkv_187:KvFirst --kvconform-release=0.25.1 "
                        f"--kvconform-results-dir={results} -k 'split_agrees and not regression' "
                        "--hypothesis-profile=kvconform-find")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    # Readable: the first three new findings in full (traceback, the shrunk example), each later one short. Read
    # in the failures section: pytest does not shorten the summary's messages when it runs on CI.
    failed = len(re.findall(r"^FAILED ", out, re.M))
    failures = out.split("short test summary info")[0]
    # Hypothesis names the example "Falsifying" or (newer releases) "Failing explicit example".
    assert failed > 3 and len(re.findall(r"(Falsifying|Failing) explicit example", failures)) == 3, out[-3000:]
    assert failures.count("of this process, shown short; every result line is in") == failed - 3, out[-3000:]
    repro = re.findall(r"^E\s+(REPRO .*)$", out, re.M)[0]
    shrink = re.findall(r"the shrunk one: (pytest .*)$", out, re.M)[0]
    assert shrink.startswith("pytest --pyargs 'kvconform.suites.test_split::test_split_agrees["), shrink
    assert " :: pytest --pyargs kvconform.suites.test_split::test_split_agrees_regression " in repro, repro
    for command, item in ((repro.split(" :: ", 1)[1], "test_split_agrees_regression["),
                          (shrink, "test_split_agrees[")):
        assert f"--kvconform-results-dir={results}" in command, command
        again = _shell(host, f"{command} -rA -p no:cacheprovider")
        ran = _ran(again.stdout)
        assert again.returncode == 1 and len(ran) == 1 and ran[0][0] == "FAILED", again.stdout[-3000:]
        assert item in ran[0][1], ran
    rows = [json.loads(x) for x in (results / "0.25.1" / "results.jsonl").read_text().splitlines()]
    assert rows and all(r["subject"] == "flexkv-187-kv-first" for r in rows)
