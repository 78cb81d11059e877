"""Where a run's result lines go: written per process, merged per release at the end, the known findings that
did not happen marked stale (or unexercised, when none of their examples ran), and the summary printed after the
run."""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from harness import results
from harness.device import compiles, costs
from harness.results import Word, findings
from harness.run.releases import ReleaseContracts

POISONED = "the device is unusable after this call"  # in the diagnosis of the line that lost a process its device


@dataclass
class Sink:
    """This process's result lines, and (in the controller) what the run's processes reported at their end."""

    results_dir: Path
    run: str
    worker: str  # this process's name in result file names: <run>-<worker>
    subject_name: str
    findings: tuple[findings.Finding, ...]
    written: int = 0  # result lines this process wrote
    workers: dict[str, dict] = field(default_factory=dict)  # xdist worker id -> what it reported at its end
    merged: dict[str, str] = field(default_factory=dict)  # release -> what merging its lines did (controller)
    _pending: list[results.Result] = field(default_factory=list, repr=False)  # lines of the batch open now
    _batches: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # the watchdog thread flushes too

    def write(self, r: ReleaseContracts, geometry: str, check: str, sparsity: str, word: Word | str, diagnosis: str = "",
              **fields) -> None:
        """Record one result line of release `r`: where every line of a run is built."""
        line = results.stamped(results.Result(
            run=self.run, release=r.release, source=r.source, build=r.build, subject=self.subject_name,
            geometry=geometry,
            check=check, sparsity=sparsity, outcome=word, diagnosis=diagnosis, **fields))
        with self._lock:
            self._pending.append(line)
            self.written += 1
        if not self._batches:
            self.flush()

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Lines written meanwhile go to their files together at the end (an item's: one open per file, not per
        line). Whoever ends the process inside a batch flushes first."""
        self._batches += 1
        try:
            yield
        finally:
            self._batches -= 1
            if not self._batches:
                self.flush()

    def flush(self) -> None:
        """Write the pending lines, in the order they were recorded."""
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            with costs.phase("record"):
                results.append_all(self.results_dir, pending, self.worker)

    def process_report(self, device: str) -> dict:
        """This process's device, compiles, loads and result lines, as the run summary keeps them."""
        c = compiles.counts()
        return {"device": device, "compiled": c.compiled, "loaded": c.loaded, "results": self.written,
                "costs": costs.CLOCK.report()}

    def culprit(self, worker: str) -> str:
        """What ended a crashed xdist worker, when it was the device: its last result line, the example that
        poisoned the device, with its repro ("" otherwise)."""
        files = self.results_dir.glob(f"*/results.{self.run}-{worker}.jsonl")
        last = [json.loads(line) for f in sorted(files, key=lambda f: f.stat().st_mtime)
                for line in f.read_text().splitlines()[-1:]]
        if last and POISONED in last[-1]["diagnosis"]:
            return f"{last[-1]['outcome']}: {last[-1]['diagnosis']}\n{last[-1]['repro']}"
        return ""

    def write_run(self, releases: list[str], warmup: compiles.Warmup | None) -> None:
        """results/run.json: the subject, releases, warm-up and every process's report."""
        self.results_dir.mkdir(parents=True, exist_ok=True)
        warm = None
        if warmup:
            warm = {**vars(warmup), "counts": vars(warmup.counts), "errors": list(warmup.errors)}
        (self.results_dir / "run.json").write_text(json.dumps({
            "subject": self.subject_name, "releases": releases, "warmup": warm, "processes": self.workers},
            indent=1) + "\n")

    def merge(self, releases: list[ReleaseContracts]) -> None:
        """Merge this run's per-process result files per release (what each merge did goes to the summary), then
        mark the known findings that did not happen in this run, or were not exercised."""
        for r in releases:
            if results.release_dir(self.results_dir, r.release).is_dir():
                merged = results.merge(self.results_dir, r.release, self.run + "-")
                if merged.added:
                    self.merged[r.release] = str(merged)
                    self._mark_findings(r)

    def _mark_findings(self, r: ReleaseContracts) -> None:
        """One line per known finding of release `r` (in its range, a geometry of the release matching its glob)
        that did not happen: stale when some of its examples ran, unexercised when none did (each unsupported, not
        run, skipped or not applicable, or none selected), so that a refusal never hides a finding."""
        # Done on merged results: with xdist a finding may apply on one worker and happen on another. This run's lines
        # only: the lines an earlier run left (items not re-checked) say nothing of what happened in this one.
        rows = [x for x in results.read(self.results_dir, r.release) if x.subject == self.subject_name
                and x.run == self.run and x.outcome not in (Word.STALE, Word.UNEXERCISED)]
        happened = {x.known for x in rows if x.known}
        # The lines name geometries no contract has: the oracle's "dense", a relayout's pair, "*" (whole release).
        geometries = {c.name for c in r.contracts} | {x.geometry for x in rows}
        for f in self.findings:
            if f.id in happened or not (f.in_range(r.release) and any(fnmatchcase(g, f.geometry) for g in geometries)):
                continue
            examples = [x for x in rows if speaks_of(f, x)]
            if any(x.outcome.value not in results.NOT_RAN for x in examples):
                word, said = Word.STALE, "applied but did not happen"
            else:
                word, said = Word.UNEXERCISED, f"not exercised, none of its examples ran: {instead(f, examples, rows, r)}"
            results.append(self.results_dir, results.Result(
                run=self.run, release=r.release, source=r.source, build=r.build, subject=self.subject_name,
                geometry=f.geometry,
                check=f.check, sparsity=f.sparsity, outcome=word, known=f.id,
                diagnosis=f"known finding {f.id} ({f.outcome}: {f.reason}) {said}"))

    def summary(self, releases: list[ReleaseContracts], head: list[str], coverage: list[str], slowest: int = 3) -> list[str]:
        """The run's id and `head` (the warm-up's lines), one line per process and per release, of this run's
        result lines only ("not run" for a release it recorded nothing of), stale and unexercised known findings, the
        `coverage` lines, and the `slowest` examples of each check with their times."""
        lines = [f"kvconform run {self.run}"] + head
        for name, w in sorted(self.workers.items()):
            busy = sum(v for c in w.get("costs", {}).values() for k, v in c.items() if k in costs.PHASES) if w else 0
            lines.append(f"kvconform process {name} on {w['device']}: {w['results']} results in {busy:.1f} s of "
                         f"items; kernels {w['compiled']} compiled, {w['loaded']} loaded from the disk cache" if w else
                         f"kvconform process {name}: ended without reporting (crashed or killed)")
        ran: list[results.Result] = []
        for r in releases:
            path = results.release_dir(self.results_dir, r.release) / "results.jsonl"
            rows = [x for x in (results.read(self.results_dir, r.release) if path.exists() else [])
                    if x.run == self.run]
            marked = [f"  {x.outcome.value.upper()} {x.known}: {x.diagnosis}" for x in rows
                      if x.outcome in (Word.STALE, Word.UNEXERCISED)]
            if all(x.outcome in (Word.NOT_APPLICABLE, Word.UNEXERCISED) for x in rows):
                na = sum(x.outcome == Word.NOT_APPLICABLE for x in rows)
                lines.append(f"kvconform {r.release} ({r.source}) {self.subject_name}: not run (this run checked "
                             f"nothing of it{f'; {na} not-applicable' if na else ''})")
                lines += marked  # a known finding it hid is said all the same
                continue
            ran += rows
            counts: dict[str, int] = {}
            for x in rows:
                counts[x.outcome.value] = counts.get(x.outcome.value, 0) + 1
            lines.append(f"kvconform {r.release} ({r.source}) {self.subject_name}: "
                         + ", ".join(f"{n} {word}" for word, n in sorted(counts.items())) + f" -> {path}")
            lines += [f"  merged: {self.merged[r.release]}"] if r.release in self.merged else []
            lines += marked
        lines += [f"kvconform {line}" for line in coverage]
        lines += [f"kvconform {line}" for line in costs.lines(costs.merged(
            [w["costs"] for w in self.workers.values() if w and "costs" in w]))]
        by_check: dict[str, list[results.Result]] = {}
        for x in ran:
            if x.seconds:
                by_check.setdefault(x.check, []).append(x)
        for check, rows in sorted(by_check.items()):
            top = sorted(rows, key=lambda x: -x.seconds)[:slowest]
            lines.append(f"kvconform slowest {check}: " + "; ".join(
                f"{x.seconds:.2f} s {x.release} {x.geometry} {x.case} ({x.outcome.value})" for x in top))
        return lines


def speaks_of(f: findings.Finding, x: results.Result) -> bool:
    """Whether a line of a release in `f`'s range is one of its examples: a line `f` applies to, or a whole-release
    line of a check it covers (geometry or sparsity "*": e.g. not-applicable), which speaks of every item there."""
    return fnmatchcase(x.check, f.check) and all(value == "*" or fnmatchcase(value, glob)
                                                 for value, glob in ((x.geometry, f.geometry), (x.sparsity, f.sparsity)))


def instead(f: findings.Finding, examples: list[results.Result], rows: list[results.Result],
            r: ReleaseContracts) -> str:
    """What a known finding's examples that did not run were, each word counted with its first reason; with none,
    why there were none."""
    if examples:
        counts = Counter(x.outcome.value for x in examples)
        first = {w: next((x.diagnosis for x in examples if x.outcome.value == w and x.diagnosis), "") for w in counts}
        return ", ".join(f"{n:,} {w}" + (f" (first: {first[w]})" if first[w] else "") for w, n in counts.most_common())
    if r.error:
        return f"its contracts could not be read ({r.error})"
    if not any(fnmatchcase(x.check, f.check) for x in rows):
        return f"no item of check {f.check} selected in this run"
    return f"no item of check {f.check} over geometry {f.geometry}, sparsity {f.sparsity} selected in this run"
