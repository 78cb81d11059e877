"""The connector compatibility table: per connector release (a folder `<package>-<X>` of `nox -s connectors`'
results, results/connectors/<package>-<X>/<vLLM release>/results.jsonl; a connector of vLLM's own is one folder,
`vllm`, its releases vLLM's), each model configuration × vLLM release
read as one word: green (every example bit-identical), red (the first failing outcome, with its REPRO line; a known
finding's id beside it), unsupported (in the package's words), not taken (the release's line says why), not
installable (the package did not install there) or not run (why). Standard library only.

`python -m harness.report.connectors DIR` prints it as markdown (DIR: a results folder holding connectors/); the
report (`nox -s report`) adds it as a section of report.md and report.html when the folder has connector results.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from html import escape as _h
from pathlib import Path

from harness import checks
from harness.matrix import version_key
from harness.recordings import allocations, api_history
from harness.results import PASSING, STALE, UNEXERCISED, Result, read

FOLDER = "connectors"
CHECKS = {c.name for c in checks.CHECKS if "connector" in c.needs}  # the checks that drive a connector
PREFIX = "model:"
UNRUN = ("not-run", "skipped", "timeout")
EVERY = "every model"
NAMED = re.compile(r"(?:^|; )([a-z][a-z0-9-]*): ")  # a model's reason in the not-applicable line: `name: why; ...`


@dataclass(frozen=True)
class Compatibility:
    """One model configuration of one connector release on one vLLM release."""

    word: str  # green, red, unsupported, not taken, not installable, not run
    detail: str = ""  # the outcome and diagnosis of the first example that is not green, or why
    repro: str = ""  # its REPRO line
    known: str = ""  # the known finding that predicted it


@dataclass(frozen=True)
class Table:
    """One connector release: its subject, the vLLM releases it ran on, its models and each cell."""

    connector: str  # `<package>-<X>`
    subject: str
    releases: tuple[str, ...]
    models: tuple[str, ...]
    cells: dict[tuple[str, str], Compatibility]  # (model, release)


def cell(lines: list[Result]) -> Compatibility:
    """One cell's word from its result lines (one model, one vLLM release, one connector release); a known finding's
    stale or unexercised line is the report's to say, not the cell's."""
    bad = [r for r in lines if r.outcome not in (*PASSING, STALE, UNEXERCISED)]
    refused = [r for r in bad if r.outcome == "unsupported"]
    failing = [r for r in bad if r.outcome not in ("unsupported", *UNRUN)]
    if failing:
        r = failing[0]
        return Compatibility("red", f"{r.outcome.value}: {r.diagnosis}", r.repro, r.known)
    if refused:
        return Compatibility("unsupported", refused[0].diagnosis)
    if bad:
        return Compatibility("not run", f"{bad[0].outcome.value}: {bad[0].diagnosis}")
    return Compatibility("green")


def tables(root: Path) -> list[Table]:
    """A table per connector release under `root`/connectors/ (none: no connector results there)."""
    out = []
    for folder in sorted(p for p in (Path(root) / FOLDER).glob("*") if p.is_dir()):
        rows = read(folder)
        if not rows:
            continue
        releases = tuple(sorted({r.release for r in rows}, key=version_key))
        installed = {r.release: r.diagnosis for r in rows if r.outcome == "install-error"}
        ours = [r for r in rows if r.check in CHECKS]
        models = tuple(dict.fromkeys(r.geometry.removeprefix(PREFIX) for r in ours if r.geometry.startswith(PREFIX)))
        not_taken = {r.release: r.diagnosis for r in ours if r.geometry == "*" and r.outcome == "not-applicable"}
        reasons = {release: _reasons(line) for release, line in not_taken.items()}
        models += tuple(dict.fromkeys(m for rs in reasons.values() for m in rs if m not in models))
        recorded = _recorded_models(releases)
        models = tuple(sorted(models, key=lambda m: recorded.index(m) if m in recorded else len(recorded))) \
            or (EVERY,)  # installed nowhere: no model ran
        by_cell: dict[tuple[str, str], list[Result]] = {}
        for r in ours:
            by_cell.setdefault((r.geometry.removeprefix(PREFIX), r.release), []).append(r)
        cells = {}
        for release in releases:
            for m in models:
                lines = by_cell.get((m, release), [])
                cells[m, release] = (Compatibility("not installable", installed[release]) if release in installed
                                     else cell(lines) if lines
                                     else Compatibility("not taken", reasons[release][m])
                                     if m in reasons.get(release, {})
                                     else Compatibility("not run", "no result line of it (not selected in the run)"))
        subject = next((r.subject for r in ours), "")
        out.append(Table(folder.name, subject, releases, models, cells))
    return out


def _recorded_models(releases: tuple[str, ...]) -> list[str]:
    """The models in the order the newest recorded release among `releases` records them (the probe's order)."""
    recorded = api_history.releases()
    for release in reversed(releases):
        if release in recorded:
            return list((allocations.read(api_history.recorded(release)) or {}).get("models", {}))
    return []


def _reasons(line: str) -> dict[str, str]:
    """Each model's reason in a release's not-applicable line of the connector check (`name: why; name: why`)."""
    found = list(NAMED.finditer(line))
    return {m.group(1): line[m.end():found[i + 1].start() if i + 1 < len(found) else len(line)]
            for i, m in enumerate(found)}


def markdown(ts: list[Table]) -> str:
    """The tables as markdown: per connector release, model × vLLM release, then each red cell's REPRO, each
    refusal's words and what was not taken or not run, with the cells they are."""
    out = []
    for t in ts:
        out += [f"### {t.connector}" + (f" (`{t.subject}`)" if t.subject else ""), "",
                "| model | " + " | ".join(t.releases) + " |", "|---|" + "---|" * len(t.releases)]
        for m in t.models:
            out.append(f"| {m} | " + " | ".join(_face(t.cells[m, r]) for r in t.releases) + " |")
        out.append("")
        for (word, text, known), where in _said(t).items():
            out.append(f"- {word} ({', '.join(where)}{f'; known finding {known}' if known else ''}): {text}")
        out.append("")
    return "\n".join(out)


def section_html(ts: list[Table]) -> str:
    """The tables as an HTML section (what `markdown` says, as tables and lists)."""
    out = ['<section id="connectors"><h2>Connectors: connector release × vLLM release × model</h2>']
    for t in ts:
        out.append(f"<h3>{_h(t.connector)}{f' ({_h(t.subject)})' if t.subject else ''}</h3><table><tr><th>model</th>"
                   + "".join(f"<th>{_h(r)}</th>" for r in t.releases) + "</tr>")
        for m in t.models:
            out.append(f"<tr><td>{_h(m)}</td>" + "".join(
                f'<td class="{t.cells[m, r].word.replace(" ", "-")}">{_h(_face(t.cells[m, r]))}</td>'
                for r in t.releases) + "</tr>")
        out.append("</table><ul>")
        for (word, text, known), where in _said(t).items():
            out.append(f"<li>{_h(word)} ({_h(', '.join(where))}{_h(f'; known finding {known}' if known else '')}): "
                       f"<code>{_h(text)}</code></li>")
        out.append("</ul>")
    return "\n".join(out) + "</section>"


def _said(t: Table) -> dict[tuple[str, str, str], list[str]]:
    """What each cell that is not green says (a red one its outcome, diagnosis and REPRO), with the cells saying it."""
    said: dict[tuple[str, str, str], list[str]] = {}
    for (m, r), c in t.cells.items():
        if c.word != "green":
            text = f"{c.detail} `{c.repro}`" if c.repro else f"`{c.detail}`"
            said.setdefault((c.word, text, c.known), []).append(f"{m} on {r}")
    return said


def _face(c: Compatibility) -> str:
    return f"{c.word} ({c.known})" if c.known else c.word


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.report.connectors DIR (a results folder holding connectors/)", file=sys.stderr)
        return 2
    ts = tables(Path(argv[0]))
    if not ts:
        print(f"no connector results under {Path(argv[0]) / FOLDER} (nox -s connectors writes them)", file=sys.stderr)
        return 1
    print(markdown(ts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
