"""A new check is three files: its module under harness/checks/, its suite in conformance/ and its line in the
declarations. A toy check with its own kind of target (a number of pages: neither a contract nor a model) and its
own draws is written into a copy of the tree, and the unchanged runner and plugin run one item of it to result
lines, keep its failing example and replay it from the REPRO line."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from envs import fresh_copy, site_packages

TOY = '''"""toy: an example drawn among a target's pages is not its last page (a check written to fail there)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from hypothesis import strategies as st

from harness import checks
from harness.checks.outcome import Outcome
from harness.results import Word
from harness.run.implementation import Implementation
from harness.run.releases import ReleaseContracts


@dataclass(frozen=True)
class Pages:
    """A release and a number of pages: the toy's own kind of target."""

    release: ReleaseContracts
    pages: int
    mode: str = ""

    @property
    def geometry(self) -> str:
        return f"pages:{self.pages}"

    @property
    def id(self) -> str:
        return f"{self.release.release}-{self.geometry}"

    @property
    def described(self) -> dict[str, object]:
        return {}


@dataclass(frozen=True)
class Page:
    """One page of a target: the toy's own kind of example."""

    index: int
    mode = "*"

    def digest(self) -> str:
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:12]

    def to_json(self) -> str:
        return json.dumps({"index": self.index})

    def words(self, extra: object) -> str:
        return f"page={self.index}"

    def summary(self, extra: object) -> str:
        return self.words(extra)


class Toy(Implementation):
    def targets(self, session):
        return [Pages(r, 4) for r in session.releases]

    def examples(self, target, sizes):
        return st.builds(Page, st.integers(0, target.pages - 1))

    def read(self, body):
        return Page(**body)

    def body(self, t):
        last = t.example.index == t.target.pages - 1
        return Outcome(Word.DIFFERS, f"page {t.example.index} is the last") if last else Outcome(Word.BIT_IDENTICAL)


IMPLEMENTATION = Toy(checks.TOY)
'''

SUITE = '''"""toy: an example drawn among a target's pages is not its last page (harness.checks.toy)."""

from harness import checks

CHECK = checks.TOY


def test_toy(conformance, target):
    conformance.run(target, CHECK)


def test_toy_regression(conformance, regression):
    conformance.replay(regression, CHECK)
'''


def _with_toy(tree: Path) -> None:
    """The three files: the module, the suite, and the declaration's line (with its place in the list)."""
    (tree / "harness" / "checks" / "toy.py").write_text(TOY)
    (tree / "conformance" / "test_toy.py").write_text(SUITE)
    declarations = tree / "harness" / "checks" / "__init__.py"
    text = declarations.read_text()
    listed = re.search(r"^CHECKS = \(.*?\)$", text, re.M | re.S).group(0)
    declarations.write_text(text.replace(listed, f'TOY = Check("toy", module="test_toy")\n{listed[:-1]}, TOY)'))


def _git_changes(tree: Path) -> list[str]:
    """The files that differ from the checkout's tree: `tree` as a git repository of the copy before the toy."""
    return sorted(subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=tree, capture_output=True,
                                 text=True, check=True).stdout.split("\n")[:-1])


def test_a_toy_check_runs_through_the_unchanged_runner_to_result_lines_and_a_replayed_repro(tmp_path):
    tree = fresh_copy(tmp_path / "tree")
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the tree"], cwd=tree,
                   check=True)
    _with_toy(tree)
    assert _git_changes(tree) == [" M harness/checks/__init__.py", "?? conformance/test_toy.py",
                                  "?? harness/checks/toy.py"]
    # The copy alone on the path (no editable kvconform's finder): python -S with this venv's packages.
    env = {**os.environ, "PYTHONPATH": site_packages()}
    results, regressions = tmp_path / "results", tmp_path / "regressions"
    done = subprocess.run([sys.executable, "-S", "-m", "pytest", "conformance/test_toy.py", "-p", "no:randomly",
                           "--kvconform-release=0.33.0", "--kvconform-release=0.25.1", "--hypothesis-seed=0",
                           f"--kvconform-results-dir={results}", f"--kvconform-regressions-dir={regressions}"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "toy 5" in out, out[-3000:]  # the header's plan: CHEAP_FACTOR examples of a check that launches nothing
    lines = [json.loads(x) for release in ("0.33.0", "0.25.1")
             for x in (results / release / "results.jsonl").read_text().splitlines()]
    toy = [x for x in lines if x["check"] == "toy"]
    assert {(x["release"], x["geometry"], x["outcome"]) for x in toy} == {
        (r, "pages:4", w) for r in ("0.33.0", "0.25.1") for w in ("bit-identical", "differs")}, toy
    [repro] = {x["repro"] for x in toy if x["release"] == "0.33.0" and x["outcome"] == "differs"}
    assert repro.startswith("REPRO toy release=0.33.0 (replay) geometry=pages:4 page=3 :: "), repro
    kept = [json.loads(p.read_text()) for p in (regressions / "builtin").glob("toy-*.json")]
    assert {(k["geometry"], k["case"]) for k in kept} == {("pages:4", "page=3")}, kept

    replayed = subprocess.run(["bash", "-c", repro.split(" :: ", 1)[1] + " -rA"], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=600)
    again = replayed.stdout + replayed.stderr
    assert replayed.returncode == 1, again[-3000:]
    [failed] = re.findall(r"^FAILED (\S+)", again, re.M)
    assert failed.startswith("conformance/test_toy.py::test_toy_regression[0.33.0-pages:4-"), again[-3000:]
    assert "differs: page 3 is the last" in again, again[-3000:]
