"""The README fits a newcomer: under 12 KB, every relative link points to a file of the repository, and its two
commands for a fresh machine are the ones .ci/run and the noxfile use (tests/test_noxfile.py checks that the
noxfile has the sessions they name)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

from envs import one_build_at_a_time, venv_seeing_these_packages

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _fresh_machine_commands() -> list[str]:
    """The indented command lines of the README's "On a fresh machine" section, in order."""
    section = _section(README.read_text(), "On a fresh machine")
    return [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def _split(command: str) -> tuple[list[str], list[str]]:
    """`pip install A B && ENV=1 nox -s S` -> (["A", "B"], ["nox", "-s", "S"]), the environment assignments dropped."""
    install, run = (shlex.split(part) for part in command.split("&&"))
    assert install[:2] == ["pip", "install"], command
    return install[2:], [w for w in run if not re.fullmatch(r"[A-Z_]+=\S*", w)]


def test_the_readme_is_under_12_kb():
    size = README.stat().st_size
    assert size < 12 * 1024, f"README.md is {size} bytes; the limit is {12 * 1024}: move detail to docs/"


def test_every_relative_link_of_the_readme_points_to_an_existing_file():
    targets = [t for t in LINK.findall(README.read_text()) if not re.match(r"[a-z][a-z+.-]*:", t)]
    assert targets, "the README links no file of the repository"
    missing = [t for t in targets if t.split("#")[0] and not (REPO / unquote(t.split("#")[0])).is_file()]
    assert not missing, missing


def test_the_readme_gives_the_main_job_and_the_test_command_as_nox_sessions():
    commands = _fresh_machine_commands()
    assert commands == ["pip install nox uv && KVCONFORM_DROP_VENV=1 nox -s conformance",
                        "pip install nox uv && nox -s tests"], commands
    doc = ast.get_docstring(ast.parse((REPO / "noxfile.py").read_text()))
    listed = {" ".join(line.split()[:3]) for line in doc.splitlines() if line.strip().startswith("nox -s ")}
    for command in commands:
        _, run = _split(command)
        assert " ".join(run) in listed, (command, sorted(listed))
    assert "KVCONFORM_DROP_VENV" in (REPO / "noxfile.py").read_text()


def test_the_readme_test_command_is_what_ci_runs_first():
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    installs = [shlex.split(line) for line in ci if "pip install" in line]
    nox_runs = [shlex.split(line) for line in ci if "pip install" not in line and re.search(r"(^|\s)nox\s", line)]
    assert installs and nox_runs, ".ci/run installs nothing or runs no nox session"
    packages, run = _split(_fresh_machine_commands()[1])
    ci_packages = [w for w in installs[0][installs[0].index("install") + 1:] if not w.startswith("-")]
    assert ci_packages == packages, (installs[0], packages)
    first = nox_runs[0]
    assert first[first.index("nox"):] == run, (first, run)


def _plugin_section() -> str:
    return _section(README.read_text(), "Your own kernel or consumer (the pytest plugin)")


def test_the_consumer_example_is_the_file_in_the_tree():
    block = re.search(r"```python\n(.*?)```", _plugin_section(), re.S).group(1)
    assert block == (REPO / "examples" / "five_axis_reader.py").read_text()


def _indented_blocks(text: str) -> list[list[str]]:
    """Each block of indented command lines in `text` (fenced code aside), a line ending in a backslash joined with
    the next."""
    blocks, current = [], []
    for line in re.sub(r"```.*?```", "", text, flags=re.S).splitlines():
        if line.startswith("    "):
            current.append(line.strip())
        elif current:
            blocks.append(current)
            current = []
    commands = []
    for block in blocks + ([current] if current else []):
        joined = []
        for line in block:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + line
            else:
                joined.append(line)
        commands.append(joined)
    return commands


def test_the_consumer_example_passes_in_a_throwaway_project_as_the_readme_says(tmp_path, tmp_path_factory):
    # An environment with torch (this one's packages), kvconform not in it: the README's lines install kvconform
    # from the checkout, non-editable, and run the suites from the throwaway project.
    env_dir = venv_seeing_these_packages(tmp_path / "env")
    project = tmp_path / "project"
    project.mkdir()
    lines = _indented_blocks(_plugin_section())[0]
    script = "\n".join(["set -euo pipefail", f". {shlex.quote(str(env_dir / 'bin' / 'activate'))}", *lines,
                         "python -c 'import kvconform; print(\"KVCONFORM AT\", kvconform.__file__)'"])
    with one_build_at_a_time(tmp_path_factory):  # its `pip install "$KVCONFORM"` builds in the checkout
        done = subprocess.run(["bash", "-c", script], cwd=project, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "KVCONFORM": str(REPO), "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    installed = re.search(r"^KVCONFORM AT (\S+)$", out, re.M).group(1)
    assert str(env_dir) in installed and str(REPO) not in installed, installed  # non-editable, in the new env
    counts = {r: re.search(rf"^kvconform {re.escape(r)} \(replay\) five-axis-reader: (.+) ->", out, re.M).group(1)
              for r in ("0.22.1", "0.25.1", "0.33.0")}
    for release in ("0.22.1", "0.25.1"):  # passes on their per-layer model-dtype 5-axis caches, unsupported elsewhere
        words = dict((w, int(n)) for n, w in re.findall(r"(\d+) ([a-z-]+)", counts[release]))
        assert words.get("bit-identical") and words.get("rejected") and words.get("unsupported"), counts[release]
        assert not set(words) - {"bit-identical", "rejected", "unsupported", "skipped", "not-applicable"}, words
    words = dict((w, int(n)) for n, w in re.findall(r"(\d+) ([a-z-]+)", counts["0.33.0"]))
    assert set(words) <= {"unsupported", "skipped", "not-applicable"} and words["unsupported"], words
    assert (project / "results" / "0.33.0" / "results.jsonl").is_file()


def test_the_connector_example_is_the_file_in_the_tree():
    blocks = re.findall(r"```python\n(.*?)```", _plugin_section(), re.S)
    assert blocks[1] == (REPO / "examples" / "block_mover.py").read_text()


def test_a_connector_written_from_the_readme_alone_passes_model_transfer(tmp_path):
    # The README's connector, copied into a throwaway project (nothing of examples/ on the path), over the two
    # releases the whole-model allocations change most between: 0.25.1 (the runner's allocation) and 0.33.0 (one
    # allocation for every layer, manager blocks split into kernel blocks).
    block = re.findall(r"```python\n(.*?)```", _plugin_section(), re.S)[1]
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "connector.py").write_text(block)
    done = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "kvconform.suites", "-p", "no:cacheprovider",
                           "--kvconform-subject=mypkg.connector:BlockMover", "--kvconform-release=0.25.1",
                           "--kvconform-release=0.33.0", "-k", "model_transfer", "--hypothesis-profile=kvconform-ci"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for release in ("0.25.1", "0.33.0"):
        words = re.search(rf"^kvconform {re.escape(release)} \(replay\) block-mover: (.+) ->", out, re.M).group(1)
        counts = dict((w, int(n)) for n, w in re.findall(r"(\d+) ([a-z-]+)", words))
        assert counts["bit-identical"] > 100 and set(counts) == {"bit-identical", "not-applicable"}, words
