"""`nox -s bisect`: the search (first red for every boundary, O(log n) builds tried, skipped builds, ends not as
said; each check shown to reject a deliberately wrong search), the candidates from matrix.toml or a commits file,
the command line, and the real install+run step over a local directory of fake per-commit vLLM wheels, as the
nightly session's test has its fake nightly index."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from envs import fake_vllm_wheel, one_build_at_a_time, venv_seeing_these_packages

from harness import matrix
from harness.matrix import bisect as b

REPO = Path(__file__).resolve().parent.parent
Search = Callable[..., b.Bisection]
SIZES = range(1, 10)  # builds after GOOD: GOOD is 0, BAD the last
BOUNDARIES = [(n, first_red) for n in SIZES for first_red in range(1, n + 1)]


def _verdicts(first_red: int, skipped: frozenset[int] = frozenset()
              ) -> tuple[Callable[[int], b.BuildVerdict], list[int]]:
    """A verdict over builds 0, 1, ...: green before `first_red`, red from it, skipped in `skipped`; and the list
    of builds it was asked about, in order."""
    asked: list[int] = []

    def verdict(i: int) -> b.BuildVerdict:
        asked.append(i)
        return b.BuildVerdict(b.SKIPPED if i in skipped else b.GREEN if i < first_red else b.RED, why=f"build {i}")

    return verdict, asked


def check_first_red(search: Search, n: int, first_red: int) -> None:
    """`search` over GOOD and n later builds finds `first_red` and the build before it as the last green, asking
    each build at most once and no more builds than the two ends plus a binary search."""
    verdict, asked = _verdicts(first_red)
    end = search(list(range(n + 1)), verdict)
    assert (end.first_red, end.last_green) == (first_red, first_red - 1), f"n={n}: {end}"
    assert len(asked) == len(set(asked)), f"a build asked twice: {asked}"
    assert len(asked) <= 2 + math.ceil(math.log2(n)), f"n={n}: {len(asked)} builds tried: {asked}"
    assert [c for c, _ in end.tried] == asked, "every build asked is listed as tried, in order"


def check_skips(search: Search, n: int, first_red: int, skipped: frozenset[int]) -> None:
    """With `skipped` builds between the ends, `search` finds the first red, or says it is one of the skipped ones
    between its last green and earliest red (which then hold it, each tried); never a wrong build, no build asked
    twice, and no more builds asked than a binary search over the others plus one per skipped build and one."""
    verdict, asked = _verdicts(first_red, skipped)
    end = search(list(range(n + 1)), verdict)
    assert len(asked) == len(set(asked)), f"a build asked twice: {asked}"
    assert end.last_green < first_red <= end.earliest_red, f"{end} around the first red {first_red}"
    assert set(end.unresolved) == set(range(end.last_green + 1, end.earliest_red)) <= skipped, end
    if end.first_red is None:
        assert end.unresolved and first_red in (*end.unresolved, end.earliest_red), end
    else:
        assert end.first_red == first_red, end
    between = [i for i in range(1, n) if i not in skipped]
    assert all(i in asked for i in range(end.last_green + 1, end.earliest_red)), \
        f"skipped builds between the last green and the earliest red left untried: {asked}"
    assert len(asked) <= 2 + len(skipped) + math.ceil(math.log2(max(len(between), 1) + 1)) + 1, asked


def check_ends(search: Search) -> None:
    """GOOD red, GOOD skipped and BAD green stop `search` with an error naming the end; GOOD is asked first."""
    for first_red, skipped, says in ((0, frozenset(), "GOOD 0 is not green: red (build 0)"),
                                     (2, frozenset({0}), "GOOD 0 is not green: skipped (build 0)"),
                                     (9, frozenset(), "BAD 4 is not red: green (build 4)")):
        verdict, asked = _verdicts(first_red, skipped)
        try:
            search(list(range(5)), verdict)
        except b.EndNotAsSaid as e:
            assert str(e) == says and [c for c, _ in e.tried] == asked, (str(e), asked)
        else:
            raise AssertionError(f"no error where the search should say: {says}")
        assert asked[0] == 0, "GOOD is confirmed first"


@pytest.mark.parametrize(("n", "first_red"), BOUNDARIES)
def test_finds_the_first_red_for_every_boundary_trying_log_n_builds(n, first_red):
    check_first_red(b.bisect, n, first_red)


@pytest.mark.parametrize("n", SIZES)
def test_skipped_builds_are_stepped_around_or_named(n):
    for first_red in range(1, n + 1):
        for skip in range(1, n):
            check_skips(b.bisect, n, first_red, frozenset({skip}))
        check_skips(b.bisect, n, first_red, frozenset(range(1, n)))
        check_skips(b.bisect, n, first_red, frozenset(range(1, n, 2)))


def test_every_build_between_skipped_names_them_all():
    verdict, asked = _verdicts(3, frozenset({1, 2, 3, 4}))
    end = b.bisect(list(range(6)), verdict)
    assert (end.first_red, end.last_green, end.earliest_red, end.unresolved) == (None, 0, 5, (1, 2, 3, 4))
    assert asked == [0, 5, 2, 1, 3, 4], "the untried build nearest the middle next (the earlier of two)"


def test_a_skip_steps_to_the_nearest_untried_build():
    verdict, asked = _verdicts(6, frozenset({4}))
    end = b.bisect(list(range(9)), verdict)
    assert asked == [0, 8, 4, 3, 5, 6] and end.first_red == 6


def test_good_red_or_bad_green_is_an_error_naming_the_end():
    check_ends(b.bisect)


def test_fewer_than_two_builds_is_refused():
    with pytest.raises(ValueError, match="got 1 build"):
        b.bisect([0], _verdicts(1)[0])


# Deliberately wrong searches, each of which one of the checks above must reject.

def _returns_last_green(candidates, verdict):
    end = b.bisect(candidates, verdict)
    return dataclasses.replace(end, earliest_red=end.last_green)


def _linear(candidates, verdict):
    tried = []
    for c in candidates:
        tried.append((c, verdict(c)))
        if tried[-1][1].word == b.RED:
            return b.Bisection(tuple(tried), candidates[candidates.index(c) - 1], c)
    raise AssertionError("no red build")


def _upper_middle_off_by_one(candidates, verdict):
    """Moves the red end one past the red build found."""
    end = b.bisect(candidates, verdict)
    i = candidates.index(end.earliest_red)
    return dataclasses.replace(end, earliest_red=candidates[min(i + 1, len(candidates) - 1)])


def _trusts_the_ends(candidates, verdict):
    return b.bisect(candidates, lambda c: b.BuildVerdict(b.GREEN) if c == candidates[0] else
                    b.BuildVerdict(b.RED) if c == candidates[-1] else verdict(c))


def _skip_is_green(candidates, verdict):
    def said(c):
        v = verdict(c)
        return b.BuildVerdict(b.GREEN) if v.word == b.SKIPPED else v
    return b.bisect(candidates, said)


def _skip_is_red(candidates, verdict):
    def said(c):
        v = verdict(c)
        return b.BuildVerdict(b.RED) if v.word == b.SKIPPED and c != candidates[0] else v
    return b.bisect(candidates, said)


def _forgets_the_skipped(candidates, verdict):
    return dataclasses.replace(b.bisect(candidates, verdict), unresolved=())


def _every_boundary(search):
    for n, first_red in BOUNDARIES:
        check_first_red(search, n, first_red)


def _every_skip(search):
    for n in SIZES:
        for first_red in range(1, n + 1):
            for skip in range(1, n):
                check_skips(search, n, first_red, frozenset({skip}))


@pytest.mark.parametrize(("mutant", "check"), [
    (_returns_last_green, _every_boundary), (_linear, _every_boundary), (_upper_middle_off_by_one, _every_boundary),
    (_trusts_the_ends, check_ends), (_skip_is_green, _every_skip), (_skip_is_red, _every_skip),
    (_forgets_the_skipped, _every_skip)], ids=lambda x: x.__name__)
def test_each_check_rejects_a_wrong_search(mutant, check):
    with pytest.raises(AssertionError):
        check(mutant)


# Candidates and the command line.

def test_release_candidates_are_the_matrix_releases_from_good_to_bad():
    found = matrix.Interpreters((matrix.Interpreter("3.11.7", "/x/python3.11"),))
    got = b.release_candidates("0.22.1", "0.33.0", found)
    assert [c.name for c in got] == ["0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0",
                                     "0.30.0", "0.31.0", "0.32.0", "0.33.0"]
    assert all(c.release == c.name and c.python == "/x/python3.11" and not c.per_commit for c in got)
    assert got[0].requirements == ("vllm==0.22.1",)
    assert b.release_candidates("0.8.5.post1", "0.9.2", found)[1].requirements == ("vllm==0.9.2", "transformers<4.54")
    assert b.release_candidates("0.8.5.post1", "0.9.2", matrix.Interpreters(()))[0].python == ""


@pytest.mark.parametrize(("good", "bad", "says"), [
    ("0.33.0", "0.22.1", "GOOD 0.33.0 must come before BAD 0.22.1"),
    ("0.22.1", "0.22.1", "GOOD 0.22.1 must come before BAD 0.22.1"),
    ("0.22.1", "main", "BAD main: main is not a release to bisect over; bisect its commits with --commits FILE"),
    ("0.22.2", "0.33.0", "vllm 0.22.2 is not in")])
def test_release_ends_out_of_order_or_unlisted_are_refused_by_name(good, bad, says):
    with pytest.raises(ValueError, match=says.replace(".", r"\.")):
        b.release_candidates(good, bad, matrix.Interpreters(()))


def _commit(i: int) -> str:
    return hashlib.sha1(f"kvconform-bisect-{i}".encode()).hexdigest()


def test_commits_file_lists_full_hashes_with_comments(tmp_path):
    f = tmp_path / "commits.txt"
    f.write_text(f"# vLLM main, oldest first\n{_commit(0)}\n\n{_commit(1)}  # the suspect\n")
    assert b.commits_listed(f) == [_commit(0), _commit(1)]
    f.write_text(f"{_commit(0)}\n{_commit(1)[:9]}\n")
    with pytest.raises(ValueError, match=rf"commits\.txt:2: '{_commit(1)[:9]}' is not a full"):
        b.commits_listed(f)
    f.write_text(f"{_commit(0)}\n{_commit(0)}\n")
    with pytest.raises(ValueError, match=r"commits\.txt:2: commit .* is listed twice"):
        b.commits_listed(f)


def test_commit_candidates_install_main_from_each_commit_s_index(tmp_path):
    commits = [_commit(i) for i in range(4)]
    main = matrix.get("main")
    python = matrix.Interpreter("3.11.7", "/x/python3.11")
    got = b.commit_candidates(commits, commits[1][:7], commits[3], "https://wheels.vllm.ai/", main, python)
    assert [c.name for c in got] == commits[1:]
    assert got[0].requirements == ("vllm", "--prerelease=allow", "--extra-index-url",
                                   f"https://wheels.vllm.ai/{commits[1]}")
    assert all(c.release == "main" and c.per_commit for c in got)
    local = b.commit_candidates(commits, commits[0], commits[1], str(tmp_path), main, None)
    assert local[0].requirements[-2:] == ("--find-links", str(tmp_path / commits[0])) and local[0].python == ""
    with pytest.raises(ValueError, match=f"GOOD {commits[2]} must come before BAD {commits[1]} in the commits file"):
        b.commit_candidates(commits, commits[2], commits[1], str(tmp_path), main, python)
    with pytest.raises(ValueError, match="BAD abcdef0: is not a commit listed in the commits file"):
        b.commit_candidates(commits, commits[0], "abcdef0", str(tmp_path), main, python)
    with pytest.raises(ValueError, match="neither a local directory nor an index URL"):
        b.commit_candidates(commits, commits[0], commits[1], str(tmp_path / "missing"), main, python)


def test_options_it_does_not_know_go_to_pytest_in_order():
    args, rest = b.parsed(["0.22.1", "0.33.0", "--kvconform-subject=m:C", "-k", "split_agrees and not x", "--co"],
                          REPO)
    assert (args.good, args.bad, args.commits) == ("0.22.1", "0.33.0", None)
    assert rest == ["--kvconform-subject=m:C", "-k", "split_agrees and not x", "--co"], "--co is not --commits"


def test_the_package_is_the_host_project_where_one_holds_it_and_as_named(tmp_path):
    assert b.parsed(["0.22.1", "0.33.0"], tmp_path)[0].package == [], "a folder of no project installs none"
    for marker in ("pyproject.toml", "setup.py"):
        project = tmp_path / marker.split(".")[0]
        project.mkdir()
        (project / marker).write_text("")
        assert b.parsed(["0.22.1", "0.33.0"], project)[0].package == ["."], marker
    assert b.parsed(["0.22.1", "0.33.0"], REPO)[0].package == [], "kvconform's checkout is no host project"
    args, rest = b.parsed(["0.22.1", "0.33.0", "--package", "mypkg[gpu]", "--package=./sub", "-x"], tmp_path)
    assert (args.package, rest) == (["mypkg[gpu]", "./sub"], ["-x"])


def test_the_suites_trial_runs_kvconform_live_on_the_build_s_release_in_the_folder_at_a_fixed_seed(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.delenv("KVCONFORM_VENVS", raising=False)
    trial = b.suites_trial(["-k", "split_agrees"], ["."], tmp_path)
    c = b.Candidate("0.23.0", "0.23.0", ("vllm==0.23.0",), "/x/python3", ">=3.10", "https://pypi.org/simple")
    out = Path("/r/0.23.0")
    assert list(trial.pytest_args(c, out)) == ["--pyargs", "kvconform.suites", "--kvconform-release=0.23.0", "-p",
                                               "no:cacheprovider", f"--kvconform-results-dir={out}",
                                               "--hypothesis-seed=0", "-k", "split_agrees"]
    assert trial.install == ("-e", str(REPO), "pytest-xdist>=3.5", ".") and trial.live
    assert (trial.cwd, trial.logs, trial.venvs) == (tmp_path, tmp_path / "results" / "bisect",
                                                    tmp_path / ".nox" / "vllm")
    seeded = b.suites_trial(["--hypothesis-seed=7"], [], tmp_path).pytest_args(c, out)
    assert [a for a in seeded if "seed" in a] == ["--hypothesis-seed=7"], "a seed the options name is kept"


class _Installed:
    """A stand-in for kvconform's installed distribution, with what its direct_url.json says (None: no file)."""

    version = "0.1.0"

    def __init__(self, direct_url: dict | None):
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


@pytest.mark.parametrize(("direct_url", "requirement"), [
    (None, "kvconform==0.1.0"),
    ({"url": "file:///src/kvconform", "dir_info": {}}, "kvconform @ file:///src/kvconform"),
    ({"url": "https://github.com/o/kvconform", "vcs_info": {"vcs": "git", "commit_id": "ab12"}},
     "kvconform @ git+https://github.com/o/kvconform@ab12"),
    ({"url": "https://github.com/o/mono", "vcs_info": {"vcs": "git", "commit_id": "ab12"}, "subdirectory": "kv"},
     "kvconform @ git+https://github.com/o/mono@ab12#subdirectory=kv"),
])
def test_an_installed_kvconform_is_installed_again_from_where_it_came(tmp_path, monkeypatch, direct_url,
                                                                      requirement):
    monkeypatch.setattr(b, "ROOT", tmp_path)  # site-packages: no checkout around harness
    monkeypatch.setattr(b.importlib.metadata, "distribution", lambda name: _Installed(direct_url))
    assert b.kvconform_requirement() == (requirement,)


def test_summary_says_the_first_red_the_tried_and_the_skipped():
    end = b.Bisection(((0, b.BuildVerdict(b.GREEN, "log: a", "vllm 0.1", 1.0)),
                       (3, b.BuildVerdict(b.RED, "log: d", "", 2.0)),
                       (1, b.BuildVerdict(b.SKIPPED, "no wheel", "", 0.1)),
                       (2, b.BuildVerdict(b.RED, "log: c", "vllm 0.3"))),
                      0, 2, ())
    lines = b.summary_lines(end, 12.34)
    assert lines[:2] == ["bisect: first red: 2 (vllm 0.3); log: c", "bisect: last green: 0 (vllm 0.1)"]
    assert "  3: red in 2.0 s" in lines and "  1: no wheel" in lines and lines[-1] == "bisect: wall time 12.3 s"


# The install+run step, over fake per-commit wheels in a local directory standing in for wheels.vllm.ai.

def _fake_wheel(where: Path, version: str, commit: str, broken: bool) -> Path:
    """A `vllm` wheel of `version` whose package says its commit (vllm/_version.py, as vLLM's builds do) and carries
    the marker `BROKEN`, which the test file run in its venv reads."""
    return fake_vllm_wheel(where, version, {
        "vllm/__init__.py": f'__version__ = "{version}"\nBROKEN = {broken}\n',
        "vllm/_version.py": f'commit_id = "{commit}"\n'})


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is the installer the bisect session uses")
def test_first_red_commit_over_a_local_directory_of_per_commit_wheels(tmp_path, capsys):
    commits = [_commit(i) for i in range(7)]
    first_red, no_wheel = 5, 3  # the middle build has no wheel: the search must step around it
    wheels = tmp_path / "wheels"
    for i, commit in enumerate(commits):
        if i != no_wheel:
            _fake_wheel(wheels / commit, f"99.0.0.dev{i}", commit, broken=i >= first_red)
    listed = tmp_path / "commits.txt"
    listed.write_text("# vLLM main, oldest first\n" + "".join(f"{c}  # build {i}\n" for i, c in enumerate(commits)))
    test_file = tmp_path / "test_kv.py"
    test_file.write_text("import vllm\n\n\ndef test_not_broken():\n    assert not vllm.BROKEN\n")
    python = matrix.Interpreter(platform.python_version(), sys.executable)
    candidates = b.commit_candidates(b.commits_listed(listed), commits[0], commits[-1], str(wheels),
                                     matrix.get("main"), python, str(listed))
    # pytest only beside the fake vLLM: the test file is the run's target, not kvconform's suites.
    trial = b.Tryout(("pytest",), lambda c, out: [str(test_file), "-q", "-p", "no:cacheprovider"],
                    tmp_path / "venvs", tmp_path / "logs", tmp_path)
    end = b.bisection(candidates, trial)
    printed = capsys.readouterr().out
    assert isinstance(end, b.Bisection), printed
    assert (end.first_red.name, end.last_green.name) == (commits[first_red], commits[first_red - 1]), printed
    words = {c.name: v.word for c, v in end.tried}
    assert [c.name for c, _ in end.tried] == [commits[i] for i in (0, 6, 3, 2, 4, 5)], printed
    assert words == {commits[0]: "green", commits[6]: "red", commits[3]: "skipped", commits[2]: "green",
                     commits[4]: "green", commits[5]: "red"}
    why = {c.name: v.why for c, v in end.tried}[commits[no_wheel]]
    assert why == f"no wheel: no *.whl in {wheels / commits[no_wheel]}"
    red = next(v for c, v in end.tried if c.name == commits[first_red])
    assert red.build == f"vllm 99.0.0.dev{first_red} ({commits[first_red]})"
    assert f"bisect: {commits[no_wheel]}: skipped in" in printed and f"{why}\n" in printed
    summary = b.summary_lines(end, 1.0)
    assert summary[0].startswith(f"bisect: first red: {commits[first_red]} (vllm 99.0.0.dev{first_red}")
    assert f"  {commits[no_wheel]}: {why}" in summary
    assert not list((tmp_path / "venvs").iterdir()), "every venv is removed after its run"


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is the installer the bisect session uses")
def test_a_run_that_is_no_verdict_skips_the_build(tmp_path):
    wheels = tmp_path / "wheels"
    commit = _commit(0)
    _fake_wheel(wheels / commit, "99.0.0.dev0", commit, broken=False)
    c = b.commit_candidates([commit, _commit(1)], commit, _commit(1), str(wheels), matrix.get("main"),
                            matrix.Interpreter(platform.python_version(), sys.executable))[0]
    empty = tmp_path / "test_none.py"
    empty.write_text("")
    trial = b.Tryout(("pytest",), lambda c, out: [str(empty), "-q", "-p", "no:cacheprovider"], tmp_path / "venvs",
                    tmp_path / "logs", tmp_path)
    v = b.verdict_of(c, trial)
    assert v.word == b.SKIPPED and v.why.startswith("pytest exit 5 (no tests collected); log: "), v
    passing = tmp_path / "test_ok.py"
    passing.write_text("def test_ok():\n    pass\n")
    replayed = b.verdict_of(c, dataclasses.replace(trial, pytest_args=lambda c, out: [str(passing)], live=True))
    assert replayed.word == b.SKIPPED and "did not say it probed vllm main live" in replayed.why, replayed


def test_the_nox_session_refuses_ends_out_of_order_before_installing(tmp_path):
    from test_noxfile import _copy, _nox

    noxfile, _ = _copy(tmp_path, {})
    done = _nox(noxfile, "-s", "bisect", "--", "0.33.0", "0.22.1", "-k", "split_agrees")
    assert done.returncode != 0
    assert "bisect: GOOD 0.33.0 must come before BAD 0.22.1" in done.stdout + done.stderr, done.stdout + done.stderr
    assert "uv pip install" not in done.stdout + done.stderr


def test_per_commit_index_url_answering_404_is_no_wheel(monkeypatch):
    import urllib.error
    import urllib.request

    def answer(url, timeout):
        raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)

    monkeypatch.setattr(urllib.request, "urlopen", answer)
    assert b.wheel_missing(f"https://wheels.vllm.ai/{_commit(0)}") == \
        f"no wheel: https://wheels.vllm.ai/{_commit(0)}/vllm/ answers 404"


def test_per_commit_wheels_are_one_setting_and_bad_ends_stop_before_installing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KVCONFORM_COMMIT_WHEELS", raising=False)
    assert matrix.commit_wheels() == "https://wheels.vllm.ai"
    monkeypatch.setenv("KVCONFORM_COMMIT_WHEELS", str(tmp_path))
    assert matrix.commit_wheels() == str(tmp_path)
    listed = tmp_path / "commits.txt"
    listed.write_text(f"{_commit(0)}\n{_commit(1)}\n")
    assert b.main([_commit(1), _commit(0), "--commits", str(listed)]) == 2
    assert f"bisect: GOOD {_commit(1)} must come before BAD {_commit(0)} in {listed}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        b.main(["0.22.1", "0.33.0", "--index", str(tmp_path)])
    assert "--index WHERE takes effect only with --commits FILE" in capsys.readouterr().err


# From a host project: kvconform installed non-editable (harness in site-packages, no checkout around it), run in
# the project's folder. A stand-in uv records what each build would install, then refuses, so no vLLM is installed.
UV = r'''
import json, os, sys
with open(os.environ["UV_CALLS"], "a") as calls:
    calls.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd()}) + "\n")
if sys.argv[1] == "venv":
    os.makedirs(sys.argv[-1], exist_ok=True)
else:
    sys.exit("stand-in uv: installs nothing")
'''


def test_from_a_host_project_the_installed_commands_read_the_matrix_and_plan_in_its_folder(tmp_path,
                                                                                          tmp_path_factory):
    env_dir = venv_seeing_these_packages(tmp_path / "env")
    with one_build_at_a_time(tmp_path_factory):
        subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                        "--disable-pip-version-check", str(REPO)], check=True, capture_output=True)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "mypkg"\nversion = "0"\n')
    (tmp_path / "uv").write_text(f"#!{sys.executable}\n{UV}")
    (tmp_path / "uv").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("KVCONFORM_VENVS", "PYTHONPATH")}
    env.update(PATH=f"{tmp_path}{os.pathsep}{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
               UV_CALLS=str(tmp_path / "calls.jsonl"))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(env_dir / "bin" / "python"), *args], cwd=project, env=env, capture_output=True,
                              text=True, timeout=300, check=False)

    done = run("-m", "harness.matrix", "--requirements", "0.9.2")
    assert (done.returncode, done.stdout.splitlines()) == (0, ["vllm==0.9.2", "transformers<4.54"]), done.stderr
    where = run("-c", "from harness import matrix; print(matrix.PATH)").stdout.strip()
    assert where.startswith(str(env_dir)) and where.endswith("harness/matrix.toml"), where
    done = run("-m", "harness.matrix.bisect", "0.24.0", "0.22.1")
    assert done.returncode == 2 and done.stderr == "bisect: GOOD 0.24.0 must come before BAD 0.22.1 in " \
        f"{where}'s release order\n", done.stderr
    documented = re.search(r"^ {4}python (-m harness\.matrix\.bisect .*)$", (REPO / "docs" / "suites.md").read_text(),
                           re.M)
    assert documented, "docs/suites.md's bisect section shows the command a host project runs"
    done = run(*shlex.split(documented.group(1)))  # 0.22.1 0.24.0 --kvconform-subject=... -k model_transfer
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in out, out
    assert "bisect: stopped: GOOD 0.22.1 is not green: skipped (uv pip install failed (exit 1): stand-in uv: " \
           "installs nothing; log: " + str(project / "results" / "bisect" / "0.22.1" / "install.log") in out, out
    assert (f"run in {project}: python -m pytest --pyargs kvconform.suites --kvconform-release=0.22.1 -p "
            f"no:cacheprovider --kvconform-results-dir={project / 'results' / 'bisect' / '0.22.1'} "
            "--hypothesis-seed=0 --kvconform-subject=mypkg.kvconform:MyConnector -k model_transfer") in out, out
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    venv = project / ".nox" / "vllm" / "bisect-0.22.1"
    assert [c["argv"][:2] for c in calls] == [["venv", "--python"], ["pip", "install"]], calls
    assert calls[0]["argv"][-1] == str(venv) and not venv.exists(), "the venv is the project's, and removed"
    assert calls[1]["argv"][4:] == ["vllm==0.22.1", f"kvconform @ {REPO.as_uri()}", "pytest-xdist>=3.5", "."]
    assert calls[1]["cwd"] == str(project), "`.` is the host project"
