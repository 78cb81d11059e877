"""The steps of the reusable workflow a consumer repository calls (.github/workflows/kvconform.yml), as commands its
`run:` blocks call: `plan` prints the releases to check as a JSON job matrix (default and all leave out the releases
where the subject's capabilities take nothing to check), `annotate` prints a report's new findings
as GitHub error annotations, `track` keeps one tracking issue per title through `gh` (opened when red, commented on
while red, closed when green), `previous` downloads the report of the caller's last scheduled run (what the report
folds `--since`: each cell's history and the last builds that passed carry on from night to night).

    python -m harness.matrix.workflow plan default|all|main|0.25.1,0.33.0 [--capabilities connector]
    python -m harness.matrix.workflow previous --dir previous
    python -m harness.matrix.workflow annotate results/report.json
    python -m harness.matrix.workflow track results/report.json --title TITLE [--label kvconform]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from harness import checks, matrix
from harness.recordings import allocations, api_history
from harness.report import schema
from harness.report.schema import Report

ANNOTATIONS = 10  # GitHub shows at most 10 error annotations of one step; later ones are dropped silently
BODY_LIMIT = 60_000  # GitHub refuses an issue or comment body over 65,536 characters
LABEL = "kvconform"
REPORT_ARTIFACT = "kvconform-report"  # the report job's upload: report.md, report.json, report.html, JUnit XML


def releases(selection: str, capabilities: frozenset[str] = frozenset(), path: Path = matrix.PATH,
             recordings: Path = api_history.ROOT) -> list[str]:
    """The release names `selection` asks for: default (matrix.toml's default subset) or all, each less the releases
    where a subject declaring `capabilities` has nothing checked (none given: none left out), or a comma list of
    matrix.toml's names (main among them), as named; a ValueError names each release matrix.toml does not list."""
    every = [r.name for r in matrix.load(path)]
    if selection in ("all", "default"):
        chosen = every if selection == "all" else [r.name for r in matrix.default(path)]
        if not capabilities:
            return chosen
        subject_takes, recorded = taken(capabilities), set(api_history.releases(recordings))
        # A release not recorded is checked: its run probes it live.
        return [r for r in chosen if r not in recorded or checked(r, subject_takes, recordings)]
    names = list(dict.fromkeys(n.strip() for n in selection.split(",") if n.strip()))
    if not names:
        raise ValueError(f"releases {selection!r} names no release: give default, all, main or a comma list")
    if unknown := [n for n in names if n not in every]:
        raise ValueError(f"releases {selection!r}: not in kvconform's matrix.toml: {', '.join(unknown)}; "
                         f"its releases: {', '.join(every)} (or default, all)")
    return names


def taken(capabilities: frozenset[str]) -> tuple[checks.Check, ...]:
    """The checks a subject declaring `capabilities` takes; a ValueError names a capability no check needs, and
    capabilities that take no check."""
    known = frozenset().union(*(c.needs for c in checks.CHECKS))
    if unknown := sorted(capabilities - known):
        raise ValueError(f"capabilities: {', '.join(unknown)} unknown; kvconform's: {', '.join(sorted(known))}")
    out = tuple(c for c in checks.CHECKS if c.module and c.needs and c.needs <= capabilities)
    if not out:
        raise ValueError(f"capabilities {', '.join(sorted(capabilities))} take no check: kvconform's checks need "
                         + "; ".join(sorted({" and ".join(sorted(c.needs)) for c in checks.CHECKS if c.needs})))
    return out


def checked(release: str, taken: tuple[checks.Check, ...], recordings: Path = api_history.ROOT) -> bool:
    """Whether one of the checks `taken` has something checked at recorded `release`, as its recording tells: a
    check of whole models takes only releases whose whole-model allocation the probe read
    (harness.recordings.allocations), every other check each recorded release."""
    if any(not c.models for c in taken):
        return True
    return allocations.read(api_history.recorded(release, recordings)) is not None


def escaped(text: str, in_property: bool = False) -> str:
    """`text` as a workflow command's message (or, `in_property`, a property such as `title`) must be written: one
    line, with the characters the runner would otherwise read as syntax percent-encoded."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if in_property else text


def annotations(report: Report) -> list[str]:
    """The workflow commands that annotate the run with the report's new findings: an error for each of the first
    ANNOTATIONS (its REPRO line last), then a notice counting the rest, which only the summary lists."""
    new = report.new_findings
    lines = []
    for f in new[:ANNOTATIONS]:
        title = f"kvconform {f.check} on vLLM {f.release}, {f.geometry}"
        message = f"{f.subject}: {f.diagnosis or f.outcome}"
        if f.repro:  # a whole-release finding (an install-error) has none
            message += "\n" + f.repro
        lines.append(f"::error title={escaped(title, True)}::{escaped(message)}")
    if len(new) > ANNOTATIONS:
        lines.append(f"::notice title=kvconform::{len(new) - ANNOTATIONS} more new findings: see the run's summary")
    return lines


def red(report: Report) -> bool:
    """Whether the report has a new finding (its verdict is RED): known, stale and unexercised findings never count."""
    return bool(report.new_findings)


def run_url(env: Mapping[str, str]) -> str:
    """The link to this workflow run, from the variables the runner sets ("" outside Actions)."""
    if not all(env.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")):
        return ""
    return f"{env['GITHUB_SERVER_URL']}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"


def issue_body(report: Report, url: str) -> str:
    """The markdown of an issue or comment on a red report: the verdict, the run, and each new finding with its REPRO
    line, as many as fit GitHub's limit on a body (the rest counted)."""
    head = f"**{report.verdict}**" + (f" ([run]({url}))" if url else "")
    parts = [head, "", "New findings (the run's summary has the full report):", ""]
    size = sum(len(p) + 1 for p in parts)
    new = report.new_findings
    for n, f in enumerate(new):
        text = (f"- `{f.check}` on vLLM {f.release}, `{f.geometry}`: {f.diagnosis or f.outcome}"
                + (f"\n  ```\n  {f.repro}\n  ```" if f.repro else ""))
        rest = f"- and {len(new) - n} more"  # room kept for it, so that the body never passes the limit
        if size + len(text) + 1 + len(rest) > BODY_LIMIT:
            parts.append(rest)
            break
        parts.append(text)
        size += len(text) + 1
    return "\n".join(parts)


def gh(*args: str) -> str:
    """What `gh args...` prints; a RuntimeError naming the command and what gh said when it fails."""
    try:
        done = subprocess.run(["gh", *args], capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        raise RuntimeError("gh (the GitHub CLI) is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"gh {' '.join(args[:2])} did not answer within 120 s") from None
    if done.returncode != 0:
        raise RuntimeError(f"gh {' '.join(args)} failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    return done.stdout


def tracked_issue(issues: list[dict], title: str) -> int | None:
    """The number of the open tracking issue titled `title` among `issues` (gh issue list's JSON), the oldest when
    there are several; None when there is none."""
    return min((i["number"] for i in issues if i["title"] == title), default=None)


def track(report: Report, title: str, label: str, url: str) -> str:
    """Open, comment on or close the tracking issue for `report` through gh; what was done, in words."""
    listed = gh("issue", "list", "--state", "open", "--label", label, "--json", "number,title", "--limit", "500")
    number = tracked_issue(json.loads(listed), title)
    if red(report) and number is None:
        # gh issue create refuses a label the repository lacks; --force makes this a no-op when it exists.
        gh("label", "create", label, "--force", "--description", "kvconform conformance tracking")
        made = gh("issue", "create", "--title", title, "--label", label, "--body", issue_body(report, url))
        return f"opened {made.strip()}"
    if red(report):
        gh("issue", "comment", str(number), "--body", "Still red.\n\n" + issue_body(report, url))
        return f"commented on #{number}: still red"
    if number is not None:
        gh("issue", "close", str(number), "--comment", f"**{report.verdict}**" + (f" ([run]({url}))" if url else ""))
        return f"closed #{number}: green"
    return "green, and no open tracking issue"


def previous(workflow_ref: str, into: Path) -> str:
    """Download the REPORT_ARTIFACT of the latest completed scheduled run of the caller's workflow (`workflow_ref`:
    GITHUB_WORKFLOW_REF, `owner/repo/.github/workflows/x.yml@ref`) into `into`; what was done, in words. Finding none
    is no error: a first run has no report before it."""
    workflow = workflow_ref.split("@", 1)[0].rsplit("/", 1)[-1]
    if not workflow.endswith((".yml", ".yaml")):
        raise ValueError(f"GITHUB_WORKFLOW_REF {workflow_ref!r} names no workflow file")
    runs = json.loads(gh("run", "list", "--workflow", workflow, "--event", "schedule", "--status", "completed",
                         "--limit", "1", "--json", "databaseId"))
    if not runs:
        return f"no completed scheduled run of {workflow}: no earlier report"
    run = str(runs[0]["databaseId"])
    try:
        gh("run", "download", run, "--name", REPORT_ARTIFACT, "--dir", str(into))
    except RuntimeError as e:  # a run that failed before its report job, or whose artifacts expired
        return f"run {run} of {workflow}: no {REPORT_ARTIFACT} artifact ({e}); no earlier report"
    return f"{into / 'report.json'}: the report of run {run} of {workflow}"


def main(argv: list[str]) -> int:
    """Run one step; the exit status (2: an unknown release, a report it cannot read, or a gh call that failed)."""
    parser = argparse.ArgumentParser(prog="python -m harness.matrix.workflow", description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    planning = steps.add_parser("plan")
    planning.add_argument("selection", help="default, all, main, or a comma list such as 0.25.1,0.33.0")
    planning.add_argument("--capabilities", default="",
                          help="the subject's capabilities, comma-separated (e.g. connector): default and all leave "
                               "out the releases where they take nothing to check")
    steps.add_parser("annotate").add_argument("report", type=Path)
    tracking = steps.add_parser("track")
    tracking.add_argument("report", type=Path)
    tracking.add_argument("--title", required=True, help="the tracking issue's title (name the subject in it)")
    tracking.add_argument("--label", default=LABEL, help=f"the label tracking issues carry (default {LABEL})")
    steps.add_parser("previous").add_argument("--dir", type=Path, required=True, help="where to put its files")
    args = parser.parse_args(argv)
    try:
        if args.step == "plan":
            capabilities = frozenset(c.strip() for c in args.capabilities.split(",") if c.strip())
            print(json.dumps(releases(args.selection, capabilities)))
        elif args.step == "annotate":
            sys.stdout.writelines(line + "\n" for line in annotations(schema.read(args.report)))
        elif args.step == "previous":
            if not (ref := os.environ.get("GITHUB_WORKFLOW_REF")):
                raise ValueError("GITHUB_WORKFLOW_REF is not set: previous runs inside a workflow run")
            print(previous(ref, args.dir))
        else:
            print(track(schema.read(args.report), args.title, args.label, run_url(os.environ)))
    except (ValueError, RuntimeError) as e:
        print(f"python -m harness.matrix.workflow {args.step}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
