"""Every command kvconform prints runs as printed, pasted into a shell where no venv is activated, from each place
kvconform runs: a host project with kvconform installed non-editable (its suites are `kvconform.suites` in
site-packages, no checkout on the path), a checkout (its suites by file path), and a bare checkout where kvconform is
importable from the folder alone. A failing gallery consumer's REPRO line and its shrink command each run exactly
the one item they name, reproduce the failure, and keep the run's options (its results folder); a REPRO line whose
kept example is not here says so. A failing run's output stays readable: the first new findings in full, the later
ones by their finding and REPRO line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from envs import fresh_copy, one_build_at_a_time, site_packages, venv_seeing_these_packages

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A throwaway project and a venv inside it, as many projects keep theirs (this one's packages, kvconform not
    among them), with kvconform installed from the checkout, non-editable: its suites lie under the project folder,
    in site-packages, and are still named as the installed module."""
    root = tmp_path_factory.mktemp("host")
    (root / "project").mkdir()
    venv_seeing_these_packages(root / "project" / ".venv")
    with one_build_at_a_time(tmp_path_factory):
        subprocess.run([str(root / "project" / ".venv" / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", str(REPO)], check=True, capture_output=True)
    return root


def _plain(**env: str) -> dict[str, str]:
    """This process's environment with no venv activated: none on PATH, no VIRTUAL_ENV."""
    return {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "PATH": "/usr/bin:/bin", **env}


def _shell(host: Path, command: str, activated: bool = True) -> subprocess.CompletedProcess:
    venv = host / "project" / ".venv"
    script = f". {shlex.quote(str(venv / 'bin' / 'activate'))}\n{command}" if activated else command
    env = _plain(PYTHONPATH=str(REPO / "examples"))  # the gallery consumers, as the README runs them
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
    # The interpreter that ran, whatever PATH holds.
    python = shlex.quote(str(host / "project" / ".venv" / "bin" / "python"))
    shrink = re.findall(r"the shrunk one: (.* -m pytest .*)$", out, re.M)[0]
    assert shrink.startswith(f"{python} -m pytest --pyargs 'kvconform.suites.test_split::test_split_agrees["), shrink
    assert f" :: {python} -m pytest --pyargs kvconform.suites.test_split::test_split_agrees_regression " in repro, repro
    for command, item in ((repro.split(" :: ", 1)[1], "test_split_agrees_regression["),
                          (shrink, "test_split_agrees[")):
        assert f"--kvconform-results-dir={results}" in command, command
        again = _shell(host, f"{command} -rA -p no:cacheprovider", activated=False)
        ran = _ran(again.stdout)
        assert again.returncode == 1 and len(ran) == 1 and ran[0][0] == "FAILED", again.stdout[-3000:]
        assert item in ran[0][1], ran
    rows = [json.loads(x) for x in (results / "0.25.1" / "results.jsonl").read_text().splitlines()]
    assert rows and all(r["subject"] == "flexkv-187-kv-first" for r in rows)


SUBJECT = ("--kvconform-subject=breakages.flexkv_187:SizeTwoAtOne", "--kvconform-release=0.22.1",
           "--kvconform-backend=FLASH_ATTN", "--kvconform-cache-dtype=auto", "--kvconform-max-examples=2",
           "-p", "no:cacheprovider", "-k", "split_agrees and not regression")  # fails split-agrees on kv-first caches


def _first_finding(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """Run `argv` (a failing run): its first new finding's verdict line and the command of its REPRO line."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    verdict = re.findall(r"^E\s+harness\.run\.loop\.NewFinding: (.*)$", out, re.M)[0]
    return verdict, re.findall(r"^E\s+REPRO .* :: (.*)$", out, re.M)[0]


def _pasted(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(["bash", "-c", f"{command} -rA"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    return done.returncode, done.stdout + done.stderr


def _reproduced(verdict: str, command: str, cwd: Path, env: dict[str, str]) -> None:
    rc, out = _pasted(command, cwd, env)
    ran = _ran(out)
    assert rc == 1 and len(ran) == 1 and "::test_split_agrees_regression[0.22.1-" in ran[0][1], out[-3000:]
    assert re.search(rf"^E\s+harness\.run\.loop\.NewFinding: {re.escape(verdict)}$", out, re.M), out[-3000:]


@pytest.fixture(scope="module")
def checkout_finding(tmp_path_factory):
    """A failing run in this checkout, as nox runs it (its venv's interpreter, not activated): the results folder,
    the first finding's verdict and REPRO command."""
    results = tmp_path_factory.mktemp("checkout") / "results"
    env = _plain(PYTHONPATH=str(REPO / "examples"))
    verdict, command = _first_finding([sys.executable, "-m", "pytest", "conformance/test_split.py", *SUBJECT,
                                       f"--kvconform-results-dir={results}"], REPO, env)
    return results, verdict, command, env


def test_a_repro_line_pastes_in_a_checkout_without_the_venv_activated(checkout_finding):
    results, verdict, command, env = checkout_finding
    assert command.startswith(f"{shlex.quote(sys.executable)} -m pytest "
                              "conformance/test_split.py::test_split_agrees_regression "), command
    _reproduced(verdict, command, REPO, env)


def test_a_repro_line_whose_kept_example_is_not_here_says_where_it_comes_from(checkout_finding, tmp_path):
    """A REPRO line pasted where its run's kept examples are not (a CI annotation pasted locally) is a usage error
    naming the example, where it was looked for and where it comes from, never a run that selects nothing."""
    results, verdict, command, env = checkout_finding
    digest = re.search(r"-k '\[0\.22\.1- and -([0-9a-f]+)\]'", command).group(1)
    elsewhere = tmp_path / "regressions"
    rc, out = _pasted(f"{command} --kvconform-regressions-dir={elsewhere}", REPO, env)
    assert rc == 4, out[-3000:]
    assert f"kept example {digest} of flexkv-187-size-two-at-one" in out, out[-3000:]
    assert f"not in {elsewhere / 'flexkv-187-size-two-at-one'}" in out, out[-3000:]
    assert "kvconform-results-0.22.1 artifact" in out and "--kvconform-regressions-dir" in out, out[-3000:]


def test_a_repro_line_pastes_in_a_bare_checkout(tmp_path):
    """A checkout where kvconform is importable from the folder alone (no install, no editable finder: python -S
    with this venv's site-packages on PYTHONPATH): the REPRO line starts that interpreter with -S as the run did."""
    bare = fresh_copy(tmp_path / "bare")
    env = _plain(PYTHONPATH=os.pathsep.join([site_packages(), str(bare / "examples")]))
    verdict, command = _first_finding([sys.executable, "-S", "-m", "pytest", "conformance/test_split.py", *SUBJECT,
                                       f"--kvconform-results-dir={tmp_path / 'results'}"], bare, env)
    assert command.startswith(f"{shlex.quote(sys.executable)} -S -m pytest "
                              "conformance/test_split.py::test_split_agrees_regression "), command
    _reproduced(verdict, command, bare, env)
