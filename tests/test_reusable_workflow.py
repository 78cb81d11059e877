"""The reusable workflow a consumer repository calls (.github/workflows/kvconform.yml): it and a README-style caller
pass actionlint and broken copies fail it; its step commands (harness.matrix.workflow, harness.matrix --requirements) do
what the workflow relies on, over report.json files `python -m harness.report` wrote, with a stand-in `gh` that
records each call; and broken copies of those commands fail the same checks."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_workflow import lint, lint_broken

from harness import matrix, results
from harness.matrix import workflow
from harness.report import schema
from harness.results import Result

REPO = Path(__file__).resolve().parent.parent
REUSABLE = REPO / ".github" / "workflows" / "kvconform.yml"
SUBJECT = "mypkg.kvconform:MyConnector"
TITLE = f"kvconform: new findings of {SUBJECT}"  # what the workflow's track step names the issue
# The caller README.md shows a consumer maintainer (linted with `uses:` pointed at a local copy of the workflow).
CALLER = re.search(r"```yaml\n(.*?uses: OWNER/kvconform/.*?)```", (REPO / "README.md").read_text(), re.S).group(1)


def test_reusable_workflow_passes_actionlint():
    done = lint(REUSABLE)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("old, new, message", [
    ("needs: plan\n", "needs: planning\n", "planning"),  # a job needing a job that does not exist
    ("SUBJECT: ${{ inputs.subject }}", "SUBJECT: ${{ inputs.subjects }}", "subjects"),  # an input under a wrong name
    ("needs.plan.outputs.releases", "needs.plan.outputs.release_list", "release_list"),  # a job output misnamed
    ("steps.plan.outputs.releases", "steps.planned.outputs.releases", "planned"),  # a step id that does not exist
])
def test_actionlint_fails_on_a_broken_reusable_workflow(tmp_path, old, new, message):
    done = lint_broken(REUSABLE, old, new, tmp_path)
    assert done.returncode != 0 and message in done.stdout, done.stdout


def caller_lint(tmp_path: Path, caller: str) -> subprocess.CompletedProcess:
    """actionlint over `caller` in a project beside a copy of the reusable workflow (a .git folder marks the project
    root, where actionlint resolves `./.github/workflows/...` and checks the inputs a call passes)."""
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (workflows / "kvconform.yml").write_text(REUSABLE.read_text())
    uses = "OWNER/kvconform/.github/workflows/kvconform.yml@main"
    assert uses in caller
    (workflows / "caller.yml").write_text(caller.replace(uses, "./.github/workflows/kvconform.yml"))
    return lint(workflows / "caller.yml")


def test_the_readme_caller_passes_actionlint(tmp_path):
    done = caller_lint(tmp_path, CALLER)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("old, new, message", [
    ('subject: "mypkg.kvconform:MyConnector",', "", 'input "subject" is required'),
    ("subject:", "subjects:", 'input "subjects" is not defined'),
    ("kvconform-repository: OWNER/kvconform, ", "", 'input "kvconform-repository" is required'),
])
def test_a_caller_with_a_wrong_input_fails_actionlint(tmp_path, old, new, message):
    assert old in CALLER
    done = caller_lint(tmp_path, CALLER.replace(old, new))
    assert done.returncode != 0 and message in done.stdout, done.stdout


def test_the_readme_caller_checks_out_the_kvconform_it_calls_and_no_input_defaults_to_a_placeholder():
    called = yaml.safe_load(CALLER)["jobs"]["kvconform"]
    assert called["with"]["kvconform-repository"] == called["uses"].split("/.github/")[0], called
    inputs = yaml.safe_load(REUSABLE.read_text())[True]["workflow_call"]["inputs"]  # YAML 1.1 reads `on` as True
    assert inputs["kvconform-repository"].get("required") is True and "default" not in inputs["kvconform-repository"]
    assert not [name for name, i in inputs.items() if "OWNER" in str(i.get("default", ""))], inputs


def test_a_forks_pull_request_runs_no_job_on_self_hosted_runners():
    # GitHub evaluates the condition; here: the plan job carries it, every other job needs the plan (a skipped plan
    # skips them), and the README says so.
    jobs = yaml.safe_load(REUSABLE.read_text())["jobs"]
    assert " ".join(jobs["plan"]["if"].split()) == (
        "github.event_name != 'pull_request' || github.event.pull_request.head.repo.full_name == github.repository "
        "|| !contains(fromJSON(inputs.runner), 'self-hosted')")
    assert jobs["conformance"]["needs"] == "plan" and "if" not in jobs["conformance"]
    assert "plan" in jobs["report"]["needs"] and "needs.plan.result == 'success'" in jobs["report"]["if"]
    docs = " ".join((REPO / "docs" / "suites.md").read_text().split())
    assert "the workflow skips every job of a fork's pull request" in docs


def test_the_readme_says_which_artifact_holds_an_annotations_kept_example():
    # The conformance job keeps its examples under results/regressions (the plugin's default beside
    # --kvconform-results-dir=results) and uploads results/ as kvconform-results-<release>: the README's download
    # puts that artifact back at results/, where the REPRO line's --kvconform-results-dir=results reads them.
    steps = yaml.safe_load(REUSABLE.read_text())["jobs"]["conformance"]["steps"]
    assert "--kvconform-results-dir=results " in steps[-2]["run"]
    assert (steps[-1]["with"]["name"], steps[-1]["with"]["path"]) == ("kvconform-results-${{ matrix.release }}",
                                                                      "results")
    assert re.search(r"^ +gh run download RUN_ID -n kvconform-results-0\.33\.0 -D results ",
                     (REPO / "docs" / "suites.md").read_text(), re.M)


def test_an_annotations_repro_reproduces_in_another_folder_from_the_downloaded_artifact(tmp_path):
    # The conformance job's pytest step as written, for a consumer that breaks split-agrees on 0.25.1 (replayed,
    # few examples); its report's REPRO line (what the annotation says), run as the README says: in another folder,
    # with the job's results/ downloaded into results/ and this venv's python in place of the runner's.
    workspace, local = tmp_path / "workspace", tmp_path / "local"
    workspace.mkdir()
    env = {**os.environ, "RELEASE": "0.25.1", "SUBJECT": "breakages.flexkv_187:KvFirst",
           "PYTHONPATH": str(REPO / "examples"),
           "PYTEST_ADDOPTS": "-p no:cacheprovider -x -k 'split_agrees and not regression' "
                             "--hypothesis-profile=kvconform-find"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the install step's venv first on PATH
    done = bash(scripts("conformance")[-1]["run"], env, workspace)
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    data = json.loads(report(workspace / "results", []).read_text())
    (f,) = data["new_findings"]
    command = shlex.split(f["repro"].split(" :: ", 1)[1])
    assert command[1:3] == ["-m", "pytest"], command
    shutil.copytree(workspace / "results", local / "results")  # gh run download ... -D results
    env.pop("PYTEST_ADDOPTS")
    again = run(sys.executable, *command[1:], "-p", "no:cacheprovider", "-rA", env=env, cwd=local)
    ran = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", again.stdout, re.M)
    assert again.returncode == 1 and [w for w, _ in ran] == ["FAILED"], again.stdout[-3000:]
    assert "regression" in ran[0][1], ran


def run(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("release, lines", [
    ("0.9.2", ["vllm==0.9.2", "transformers<4.54"]),
    ("0.25.1", ["vllm==0.25.1"]),
])
def test_requirements_prints_a_release_and_its_pins_one_argument_a_line(release, lines):
    done = run(sys.executable, "-m", "harness.matrix", "--requirements", release)
    assert done.returncode == 0 and done.stdout.splitlines() == lines, done.stderr


def test_requirements_of_main_take_it_from_the_nightly_index(tmp_path):
    done = run(sys.executable, "-m", "harness.matrix", "--requirements", "main",
               env={**os.environ, "KVCONFORM_NIGHTLY_INDEX": str(tmp_path)})
    assert done.stdout.splitlines() == ["vllm", "--prerelease=allow", "--find-links", str(tmp_path)], done.stderr


@pytest.mark.parametrize("release, index", [("0.25.1", "https://pypi.org/simple"), ("main", "NIGHTLY")])
def test_index_prints_where_a_releases_vllm_comes_from(tmp_path, release, index):
    env = {k: v for k, v in os.environ.items() if k not in ("UV_DEFAULT_INDEX", "UV_INDEX_URL")}
    done = run(sys.executable, "-m", "harness.matrix", "--index", release,
               env={**env, "KVCONFORM_NIGHTLY_INDEX": str(tmp_path)})
    assert done.stdout.splitlines() == [str(tmp_path) if index == "NIGHTLY" else index], done.stderr


def test_requirements_of_an_unknown_release_are_refused_naming_it():
    done = run(sys.executable, "-m", "harness.matrix", "--requirements", "0.99.9")
    assert done.returncode == 2 and "vllm 0.99.9 is not in" in done.stderr and not done.stdout


def scripts(job: str) -> list[dict]:
    """The steps of a job of the reusable workflow that run a script."""
    return [s for s in yaml.safe_load(REUSABLE.read_text())["jobs"][job]["steps"] if "run" in s]


def test_run_blocks_interpolate_no_expression():
    # An input reaches a script through env, never pasted into its text: a subject or package string cannot
    # inject shell, and the scripts the tests below run are the workflow's as written.
    for job in ("plan", "conformance", "report"):
        assert all("${{" not in s["run"] for s in scripts(job)), job


def bash(script: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """A run: block as the runner runs it (bash -e)."""
    return run("bash", "--noprofile", "--norc", "-e", "-c", script, env=env, cwd=cwd)


@pytest.mark.parametrize("selection, capabilities, releases", [
    ("default", "", [r.name for r in matrix.default()]),
    ("default", "split,forward", [r.name for r in matrix.default()]),
    # A connector checks nothing where the whole-model allocation was not read: 0.8.5.post1 to 0.10.2.
    ("default", "connector", [r.name for r in matrix.default() if r.name != "0.8.5.post1"]),
    ("all", "connector", [r.name for r in matrix.load()][3:]),
    ("0.25.1, main", "connector", ["0.25.1", "main"]),
    ("0.25.1,9.9.9", "", "not in kvconform's matrix.toml: 9.9.9;"),
    ("default", "conector", "capabilities: conector unknown; kvconform's: autotune, connector, forward, split, "),
])
def test_the_plan_step_gives_the_job_matrix_or_fails_naming_an_unknown_release(tmp_path, runner, selection,
                                                                               capabilities, releases):
    (step,) = scripts("plan")
    output = tmp_path / "output"
    done = bash(step["run"], {**runner, "RELEASES": selection, "CAPABILITIES": capabilities,
                              "GITHUB_OUTPUT": str(output)}, REPO)
    if isinstance(releases, list):
        assert done.returncode == 0 and output.read_text() == f"releases={json.dumps(releases)}\n", done.stderr
    else:  # no output at all: an empty matrix would pass as a run of nothing
        assert done.returncode != 0 and releases in done.stderr and not output.exists()


def test_the_jobs_run_what_the_caller_asks_for():
    jobs = yaml.safe_load(REUSABLE.read_text())["jobs"]
    assert set(jobs) == {"plan", "conformance", "report"}
    per_release = jobs["conformance"]
    assert per_release["runs-on"] == "${{ fromJSON(inputs.runner) }}"
    assert per_release["strategy"]["matrix"]["release"] == "${{ fromJSON(needs.plan.outputs.releases) }}"
    assert per_release["env"]["KVCONFORM_PROFILE"] == "${{ inputs.profile }}"
    assert scripts("conformance")[-1]["run"] == (
        'python -m pytest --pyargs kvconform.suites --kvconform-release="$RELEASE" --kvconform-subject="$SUBJECT" '
        '--kvconform-results-dir=results --junitxml="results/$RELEASE/junit.xml"')
    upload = per_release["steps"][-1]
    assert upload["if"] == "always()" and upload["with"]["name"] == "kvconform-results-${{ matrix.release }}"
    download, *_, upload = [s for s in jobs["report"]["steps"] if "with" in s and "path" in s["with"]]
    assert download["with"]["pattern"] == "kvconform-results-*" and download["with"]["merge-multiple"] is True
    assert set(upload["with"]["path"].split()) == {f"results/{f}" for f in ("report.md", "report.json", "report.html",
                                                                             "*/junit.xml")}


# A recorder standing in for uv and for python's `-m pip`: appends its argv (its own name first) as a JSON line to
# $CALLS; python runs anything else as this interpreter does.
RECORDER = r'''
import json, os, sys
if os.path.basename(sys.argv[0]) == "python" and sys.argv[1:3] != ["-m", "pip"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
'''


@pytest.mark.parametrize("release, package, installed, index", [
    ("0.9.2", ". extra-pkg>=1", ["vllm==0.9.2", "transformers<4.54", "./.kvconform", "pytest-xdist>=3.5", ".",
                                  "extra-pkg>=1"], "https://pypi.org/simple"),
    ("main", ".", ["vllm", "--prerelease=allow", "--extra-index-url", "https://wheels.vllm.ai/nightly",
                   "./.kvconform", "pytest-xdist>=3.5", "."], "https://wheels.vllm.ai/nightly"),
])
def test_the_install_step_installs_the_release_with_its_pins_kvconform_and_the_package(tmp_path, release, package,
                                                                                      installed, index):
    (step,) = [s for s in scripts("conformance") if s.get("id") == "install"]
    bin_dir, workspace = tmp_path / "bin", tmp_path / "workspace"
    bin_dir.mkdir()
    workspace.mkdir()
    (workspace / ".kvconform").symlink_to(REPO)  # where the job checks kvconform out
    for name in ("uv", "python"):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{RECORDER}")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVCONFORM_NIGHTLY_INDEX", "UV_DEFAULT_INDEX", "UV_INDEX_URL")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", CALLS=str(tmp_path / "calls.jsonl"),
               RELEASE=release, PACKAGE=package, RUNNER_TEMP=str(tmp_path), GITHUB_PATH=str(tmp_path / "path"),
               GITHUB_ENV=str(tmp_path / "env"))
    done = bash(step["run"], env, workspace)
    assert done.returncode == 0, done.stderr
    venv = tmp_path / "kvconform-venv"
    assert [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()] == [
        ["python", "-m", "pip", "install", "uv"],
        ["uv", "venv", "--python", str(bin_dir / "python"), str(venv)],
        ["uv", "pip", "install", "--python", f"{venv}/bin/python", *installed]]
    assert (tmp_path / "path").read_text() == f"{venv}/bin\n"  # the later steps' python is the venv's
    # The later steps' result lines name the index their vLLM came from (harness.matrix.build).
    assert (tmp_path / "env").read_text() == f"KVCONFORM_VLLM_INDEX={index}\n"


# A stand-in for the GitHub CLI: appends each call (argv, and the text of --body, --body-file or --comment) as a JSON
# line to $GH_CALLS, answers `gh issue list` from the issues in $GH_STATE, and updates them on create and close.
GH = r'''
import json, os, sys
from pathlib import Path

args = sys.argv[1:]


def option(name):
    return args[args.index(name) + 1] if name in args else None


body = option("--body") or option("--comment")
if option("--body-file"):
    body = sys.stdin.read() if option("--body-file") == "-" else Path(option("--body-file")).read_text()
with open(os.environ["GH_CALLS"], "a") as calls:
    calls.write(json.dumps({"argv": args, "body": body}) + "\n")
state = Path(os.environ["GH_STATE"])
issues = json.loads(state.read_text())
if args[:2] == ["issue", "list"]:
    chosen = [i for i in issues if i["state"] == option("--state") and option("--label") in i["labels"]]
    print(json.dumps([{k: i[k] for k in option("--json").split(",")} for i in chosen]))
elif args[:2] == ["issue", "create"]:
    issues.append({"number": len(issues) + 1, "title": option("--title"), "labels": [option("--label")],
                   "state": "open"})
    print(f"https://github.com/octo/consumer/issues/{len(issues)}")
elif args[:2] in (["issue", "comment"], ["issue", "close"]):
    issue = next((i for i in issues if i["number"] == int(args[2]) and i["state"] == "open"), None)
    if issue is None:
        sys.exit(f"stand-in gh: no open issue {args[2]}")
    issue["state"] = "closed" if args[1] == "close" else "open"
elif args[:2] == ["run", "list"]:  # the caller's scheduled runs, newest first, from $GH_RUNS
    runs = json.loads(Path(os.environ["GH_RUNS"]).read_text()) if os.environ.get("GH_RUNS") else {}
    print(json.dumps([{"databaseId": int(r)} for r in runs][:int(option("--limit"))]))
elif args[:2] == ["run", "download"]:
    runs = json.loads(Path(os.environ["GH_RUNS"]).read_text()) if os.environ.get("GH_RUNS") else {}
    if option("--name") != "kvconform-report" or not runs.get(args[2]):
        sys.exit(f"stand-in gh: no artifact {option('--name')} in run {args[2]}")
    Path(option("--dir")).mkdir(parents=True, exist_ok=True)
    (Path(option("--dir")) / "report.json").write_text(Path(runs[args[2]]).read_text())
elif args[:2] != ["label", "create"]:
    sys.exit(f"stand-in gh: no answer for {args}")
state.write_text(json.dumps(issues))
'''
# Open issues the tracker must leave alone: another subject's, and one of the same title without the label.
SEEDED = [{"number": 1, "title": "kvconform: new findings of other.kernel:Other", "labels": ["kvconform"],
           "state": "open"},
          {"number": 2, "title": TITLE, "labels": ["question"], "state": "open"}]
OPENED = 3  # the number the stand-in gives the tracker's issue


@pytest.fixture
def runner(tmp_path) -> dict[str, str]:
    """The environment of a step on a runner with the stand-in gh (and this interpreter as `python`) first on PATH:
    the calls are read back with `calls`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f"#!{sys.executable}\n{GH}")
    (bin_dir / "gh").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    (tmp_path / "issues.json").write_text(json.dumps(SEEDED))
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "GH_STATE": str(tmp_path / "issues.json"), "GH_CALLS": str(tmp_path / "calls.jsonl"),
            "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "octo/consumer", "GITHUB_RUN_ID": "7"}


def calls(env: dict[str, str]) -> list[dict]:
    path = Path(env["GH_CALLS"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


GEOMETRY = {"geometry": "kv-first:KV.B.N.H.D", "family": "kv-first", "order": "KV.B.N.H.D", "cache_dtype": "auto",
            "backends": ("FLASH_ATTN",)}


def finding(release: str, n: int, diagnosis: str = "1 of 8 elements differ") -> Result:
    """A new finding as the suites write it: a `differs` line with its REPRO line."""
    return Result(run="r1", release=release, source="replay", subject=SUBJECT, check="bit-identity", sparsity="none",
                  outcome="differs", case=f"c{n}", diagnosis=diagnosis, **GEOMETRY,
                  repro=f"REPRO bit-identity release={release} (replay) geometry=kv-first:KV.B.N.H.D case {n} :: "
                        f"python -m pytest --pyargs kvconform.suites -k '[{release}- and -c{n}]'")


def passed(release: str) -> Result:
    return Result(run="r1", release=release, source="replay", subject=SUBJECT, check="bit-identity", sparsity="none",
                  outcome="bit-identical", case="c", **GEOMETRY)


def written(root: Path, lines: list[Result]) -> Path:
    """`root` with `lines` written and merged into it as a run does."""
    for line in lines:
        results.append(root, line, "w")
    for release in {line.release for line in lines}:
        results.merge(root, release)
    return root


def report(root: Path, lines: list[Result]) -> Path:
    """report.json of `python -m harness.report` over `lines`, written into `root`."""
    done = run(sys.executable, "-m", "harness.report", str(written(root, lines)))
    assert done.returncode == 0, done.stderr
    return root / "report.json"


RUNS = {  # a red run, a red one after one of its findings was fixed, a green one
    "red": [finding("0.25.1", 1), finding("0.33.0", 2), passed("0.25.1")],
    "still red": [finding("0.33.0", 2), passed("0.25.1")],
    "green": [passed("0.25.1"), passed("0.33.0")],
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    return {name: report(tmp_path_factory.mktemp("results"), lines) for name, lines in RUNS.items()}


def command(breakage: str) -> list[str]:
    """`python -m harness.matrix.workflow`, or the same with `breakage` (a statement over the module, `w`) done
    first."""
    if not breakage:
        return [sys.executable, "-m", "harness.matrix.workflow"]
    body = f"import sys\nimport harness.matrix.workflow as w\n{breakage}\nsys.exit(w.main(sys.argv[1:]))"
    return [sys.executable, "-c", body]


def tracking_problems(runs: list[tuple[subprocess.CompletedProcess, list[dict]]]) -> list[str]:
    """What is wrong with the gh calls that change issues, of tracking the red, still red and green reports in turn
    ([] when right): the first opens one issue titled TITLE with the kvconform label and its findings' REPRO lines,
    the second comments on that issue alone with its REPRO line, the third closes it; nothing touches another issue."""
    problems = [f"{name} run failed: {done.stderr}" for name, (done, _) in zip(RUNS, runs) if done.returncode != 0]
    red, still, green = [[c for c in made if c["argv"][:2] != ["issue", "list"]] for _, made in runs]
    repros = {name: [r.repro for r in lines if r.repro] for name, lines in RUNS.items()}
    opened = [c for c in red if c["argv"][0] == "issue"]
    if [c["argv"][:2] for c in opened] != [["issue", "create"]]:
        problems.append(f"the red run did not open one issue: {opened}")
    elif (opened[0]["argv"][opened[0]["argv"].index("--title") + 1] != TITLE
          or opened[0]["argv"][opened[0]["argv"].index("--label") + 1] != "kvconform"):
        problems.append(f"the red run's issue is not titled {TITLE!r} with the kvconform label: {opened[0]['argv']}")
    elif missing := [r for r in repros["red"] if r not in opened[0]["body"]]:
        problems.append(f"the red run's issue lacks the REPRO lines {missing}")
    if [c["argv"][:3] for c in still] != [["issue", "comment", str(OPENED)]]:
        problems.append(f"the still red run did not comment on issue {OPENED} alone: {still}")
    elif missing := [r for r in repros["still red"] if r not in still[0]["body"]]:
        problems.append(f"the still red run's comment lacks the REPRO lines {missing}")
    if [c["argv"][:3] for c in green] != [["issue", "close", str(OPENED)]]:
        problems.append(f"the green run did not close issue {OPENED} alone: {green}")
    return problems


@pytest.mark.parametrize("breakage, problem", [
    ("", None),
    ("w.tracked_issue = lambda issues, title: None", "the still red run did not comment"),  # always creates
    ("w.tracked_issue = lambda issues, title: min(i['number'] for i in issues)", "the red run did not open"),
    ("w.red = lambda report: True", "the green run did not close"),
    ("w.issue_body = lambda report, url: report.verdict", "the red run's issue lacks the REPRO lines"),
])
def test_tracking_opens_one_issue_comments_on_it_while_red_and_closes_it_when_green(runner, reports, breakage, problem):
    runs = []
    for name in RUNS:
        before = len(calls(runner))
        done = run(*command(breakage), "track", str(reports[name]), "--title", TITLE, env=runner)
        runs.append((done, calls(runner)[before:]))
    found = tracking_problems(runs)
    if problem is None:
        assert found == [], found
        assert [i["state"] for i in json.loads(Path(runner["GH_STATE"]).read_text())] == ["open", "open", "closed"]
        assert "https://github.com/octo/consumer/actions/runs/7" in runs[0][1][-1]["body"]  # the run is linked
    else:
        assert any(p.startswith(problem) for p in found), found


def unescaped(text: str) -> str:
    """A workflow command's message or property as the runner reads it back."""
    for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(code, char)
    return text


def annotation_problems(out: str, report: dict) -> list[str]:
    """What is wrong with annotate's output for `report` ([] when right): one line per command, an `::error` for each
    of the first 10 new findings, its title and message escaped so that they read back as the finding (its REPRO line
    last), then one line saying how many more the summary has."""
    lines, new = out.splitlines(), report["new_findings"]
    problems = [] if len(lines) == 11 else [f"wrong number of lines: {len(lines)}, not 10 errors and one more"]
    for line, f in zip(lines[:10], new):
        command, _, message = line.partition("::")[2].partition("::")
        want = (f"kvconform {f['check']} on vLLM {f['release']}, {f['geometry']}",
                f"{f['subject']}: {f['diagnosis']}\n{f['repro']}")
        title = command.removeprefix("error title=")
        if not command.startswith("error title=") or {":", ","} & set(title) or "\r" in message:
            problems.append(f"not an escaped error command: {line!r}")
        elif (unescaped(title), unescaped(message)) != want:
            problems.append(f"{line!r} does not read back as {want!r}")
    if not lines or "2 more new findings" not in lines[-1]:
        problems.append(f"no line says 2 more new findings are in the summary: {lines[-1:]}")
    return problems


@pytest.fixture(scope="module")
def twelve(tmp_path_factory) -> Path:
    """report.json with 12 new findings (one a release: the failing lines of one release, check and geometry with one
    kind of diagnosis are one finding), each with a diagnosis a workflow command must escape."""
    releases = [r.name for r in matrix.load()][:12]
    return report(tmp_path_factory.mktemp("results"), [
        finding(rel, n, f"100% of 8 elements differ,\r\nthe first at block {n}: axis N")
        for n, rel in enumerate(releases)])


@pytest.mark.parametrize("breakage, problem", [
    ("", None),
    ("w.escaped = lambda text, in_property=False: text", "wrong number of lines"),  # raw line breaks split commands
    (("w.escaped = lambda text, in_property=False: text.replace('%', '%25').replace('\\r', '%0D')"
      ".replace('\\n', '%0A')"), "not an escaped error command"),  # a title's `:` and `,` left as they are
    ("w.ANNOTATIONS = 12", "no line says 2 more"),  # more errors than GitHub shows
])
def test_annotate_prints_ten_escaped_errors_and_counts_the_rest(twelve, breakage, problem):
    data = json.loads(twelve.read_text())
    assert len(data["new_findings"]) == 12 and all("%" in f["diagnosis"] for f in data["new_findings"])
    done = run(*command(breakage), "annotate", str(twelve))
    assert done.returncode == 0, done.stderr
    found = annotation_problems(done.stdout, data)
    if problem is None:
        assert found == [], found
    else:
        assert any(p.startswith(problem) for p in found), found


def test_an_issue_body_stays_within_the_limit_and_counts_what_it_leaves_out(twelve, monkeypatch):
    data = schema.read(twelve)
    monkeypatch.setattr(workflow, "BODY_LIMIT", 1_000)
    body = workflow.issue_body(data, "")
    shown = sum(f.repro in body for f in data.new_findings)
    assert len(body) <= 1_000 and 0 < shown < 12 and body.endswith(f"- and {12 - shown} more")


def test_the_report_jobs_scripts_as_written_report_annotate_and_track(tmp_path, runner):
    # Run where the report job runs them: a kvconform checkout (here on PYTHONPATH) with the downloaded results.
    written(tmp_path / "results", RUNS["red"])
    summary = tmp_path / "summary.md"
    env = {**runner, "PYTHONPATH": str(REPO), "GITHUB_STEP_SUMMARY": str(summary), "SUBJECT": SUBJECT,
           "GH_TOKEN": "token", "GH_REPO": "octo/consumer",
           "GITHUB_WORKFLOW_REF": "octo/consumer/.github/workflows/nightly.yml@refs/heads/main"}
    steps = scripts("report")
    assert steps[-1]["if"] == "github.event_name == 'schedule'"  # only scheduled runs track
    outs = []
    for step in steps:
        done = bash(step["run"], env, tmp_path)
        assert done.returncode == 0, (step["run"], done.stderr)
        outs.append(done.stdout)
    assert summary.read_text() == (tmp_path / "results" / "report.md").read_text()
    assert sum(line.startswith("::error title=") for line in "".join(outs).splitlines()) == 2
    created = [c for c in calls(runner) if c["argv"][:2] == ["issue", "create"]]
    assert len(created) == 1 and TITLE in created[0]["argv"]


@pytest.mark.parametrize("artifact", [True, False])
def test_a_scheduled_report_folds_the_previous_scheduled_runs_report(tmp_path, runner, artifact):
    # Night 1 was red on 0.33.0 (and green on 0.25.1); tonight both pass. The previous step finds night 1's run of
    # the caller's workflow and its report artifact; the report step folds tonight's lines --since it.
    previous = report(tmp_path / "night1", RUNS["red"])
    (tmp_path / "runs.json").write_text(json.dumps({"41": str(previous) if artifact else ""}))
    written(tmp_path / "results", RUNS["green"])
    env = {**runner, "PYTHONPATH": str(REPO), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
           "SUBJECT": SUBJECT, "GH_RUNS": str(tmp_path / "runs.json"),
           "GITHUB_WORKFLOW_REF": "octo/consumer/.github/workflows/nightly.yml@refs/heads/main"}
    said = []
    for step in scripts("report")[:2]:  # previous, then report
        done = bash(step["run"], env, tmp_path)
        assert done.returncode == 0, (step["run"], done.stderr)
        said.append(done.stdout)
    listed = next(c["argv"] for c in calls(runner) if c["argv"][:2] == ["run", "list"])
    assert listed[listed.index("--workflow") + 1] == "nightly.yml" and "schedule" in listed
    tonight = json.loads((tmp_path / "results" / "report.json").read_text())
    if not artifact:  # a run without the artifact: no earlier report, said, and no failure
        assert tonight["changes"] is None and tonight["history"] == []
        assert "run 41 of nightly.yml: no kvconform-report artifact" in said[0], said[0]
        return
    assert "the report of run 41 of nightly.yml" in said[0], said[0]
    assert [c["release"] for c in tonight["changes"]["fixes"]] == ["0.25.1", "0.33.0"]
    assert [p["verdict"] for p in tonight["history"]] == [json.loads(previous.read_text())["verdict"]]
    assert tonight["history"][0]["cells"][SUBJECT]["0.33.0"]["bit-identity"] == [0, 1, True]


def test_track_refuses_a_file_that_is_no_report(tmp_path, runner):
    (tmp_path / "report.json").write_text(json.dumps({"verdict": "GREEN"}))
    done = run(*command(""), "track", str(tmp_path / "report.json"), "--title", TITLE, env=runner)
    assert done.returncode == 2 and f"{tmp_path / 'report.json'}: not a report.json" in done.stderr
    assert calls(runner) == []  # nothing done to any issue
