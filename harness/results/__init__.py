"""Results: one JSON line per checked item, under results/<release>/results.jsonl.

A run is one pytest process with its xdist workers; every line it writes carries its id (`run`) and the time the line
was written. Each process appends to its own results.<run>-<worker>.jsonl; the controller merges its run's files
into results.jsonl when it ends (`merge`). A run's lines replace the previous lines of the items it checked (an item:
subject, check, geometry, backends, cache dtype, sparsity; a whole-release line's geometry is "*") and no others: a
narrower re-run (`-k split`) replaces what it re-ran and keeps the rest, each kept line with its own run id.
Outcome words are never folded into one another (harness.report keeps them apart):
  bit-identical     paged and dense (or two runs, or two splits) agree bit for bit
  within-tolerance  the oracle check held at its stated tolerance
  rejected          a malformed cache was refused with the documented ContractError
  differs           a value check failed (with the diagnosis)
  accepted          a malformed cache was NOT refused, or refused without naming shape and contract
  unsupported       the subject said it cannot run the case (its reason is the diagnosis)
  contract-error    the release's layout could not be read, or the subject could not split it
  subject-error     the subject raised on a case it said it supports
  install-error     the release could not be installed (written by nox through `python -m harness.results`)
  harness-error     a bug in kvconform itself
  skipped           the check could not run here (e.g. vLLM's CUDA write op without CUDA); never a pass
  not-applicable    the check needs a capability the subject does not declare (e.g. forwards of a KV-cache
                    consumer): one line per release and check; never a pass, never a finding
  not-run           a kernel check left out because the subject's split already reads other elements than the
                    contract's K/V there (split-agrees reports that finding); never a pass
  timeout           the item ran past its time limit (--kvconform-timeout): a harness limit naming the item and the
                    seconds, with the example it was running; never a verdict on the subject, never a pass
Two words are no check's outcome; each marks a known finding, per release of the run that wrote it (a release it wrote
lines for, in the finding's range, with a geometry its glob matches: a contract's, or one this run's lines name):
  stale             the finding applied (an example it covers ran: any outcome but the ones saying the check did not
                    run) but did not happen
  unexercised       none of its examples ran there: every one it covers was unsupported, not run, skipped or not
                    applicable, or the run selected none (a check deselected); the diagnosis says which. Never a pass:
                    a refusal must not hide a known finding
A later run of the subject that checks any item the finding covers drops either line (and writes it again if it still
holds).

`python -m harness.results install-error RELEASE REASON [--dir results]` records a failed install.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections import Counter
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from enum import Enum
from fnmatch import fnmatchcase
from pathlib import Path

from harness import checks
from harness.matrix.build import Build


class Word(str, Enum):
    """An outcome word (the list above); a str, so that result lines hold the word itself."""

    BIT_IDENTICAL = "bit-identical"
    WITHIN_TOLERANCE = "within-tolerance"
    REJECTED = "rejected"
    DIFFERS = "differs"
    ACCEPTED = "accepted"
    UNSUPPORTED = "unsupported"
    CONTRACT_ERROR = "contract-error"
    SUBJECT_ERROR = "subject-error"
    INSTALL_ERROR = "install-error"
    HARNESS_ERROR = "harness-error"
    SKIPPED = "skipped"
    NOT_RUN = "not-run"
    NOT_APPLICABLE = "not-applicable"
    TIMEOUT = "timeout"
    STALE = "stale"  # not a check's outcome: a known finding that applied but did not happen
    UNEXERCISED = "unexercised"  # not a check's outcome: a known finding none of whose examples ran

    @property
    def passing(self) -> bool:
        """The check held (the only words that count as a pass)."""
        return self.value in PASSING


STALE, UNEXERCISED = Word.STALE, Word.UNEXERCISED
OUTCOMES = tuple(w.value for w in Word if w not in (STALE, UNEXERCISED))  # what a check (or a known finding) can say
PASSING = ("bit-identical", "within-tolerance", "rejected")
NOT_RAN = ("unsupported", "not-run", "skipped", "not-applicable")  # a check's outcomes that say it did not run
SCHEMA = 2  # result lines without it (an older kvconform's) are refused by `read`


@dataclass(frozen=True, kw_only=True)
class Result:
    """One result line: what was checked (run, release, how its contracts were read, geometry and what it is,
    check, subject, example), how it ended, and where. Built by keyword only; `known` is the id of the known
    finding that predicted the outcome, if any."""

    run: str  # the id of the run that wrote it (new_run_id)
    time: str = ""  # when it happened (UTC, ISO 8601; stamped when written unless set)
    release: str
    source: str  # "live" (probed from the installed vLLM), "replay" (recorded fixture), or "install"
    build: Build | None = None  # the vLLM build the contracts came from (harness.matrix.build); none: install-error
    subject: str
    check: str  # a harness.checks name
    outcome: Word
    geometry: str = "*"  # Contract.name, a label ("dense"), or "*" for a whole-release outcome
    backends: tuple[str, ...] = ()  # the attention backends that hand a layer this geometry in this release
    cache_dtype: str = ""  # of the geometry ("" when there is none)
    family: str = ""  # kv-first, blocks-first, packed, ...
    order: str = ""  # its physical axis order, outermost first (B.KV.N.H.D)
    layers: str = ""  # "per-layer" or "cross-layer" (one allocation for several layers)
    sparsity: str = "*"
    case: str = ""  # digest of the example
    repro: str = ""  # one line that reproduces it
    diagnosis: str = ""
    known: str = ""
    device: str = ""  # where it ran ("cuda:1", "cpu"); "" for whole-release outcomes
    seconds: float = 0.0  # how long the example took (the subject calls and the comparison)
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "outcome", Word(self.outcome))
        except ValueError:
            raise ValueError(f"unknown outcome {self.outcome!r}; known: {tuple(w.value for w in Word)}") from None
        object.__setattr__(self, "backends", tuple(self.backends))
        if isinstance(self.build, dict):  # as a line holds it
            object.__setattr__(self, "build", Build(**self.build))


def new_run_id() -> str:
    """A run's id: when it started (UTC) and a random part, unique across machines and processes."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def release_dir(root: Path, release: str) -> Path:
    return Path(root) / release


def stamped(result: Result) -> Result:
    """The result with the time it happened, unless it has one."""
    return result if result.time else replace(result, time=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def append(root: Path, result: Result, worker: str | None = None) -> None:
    """Add one line to this worker's file for the result's release (to the merged file when `worker` is None),
    stamped with the time it was written."""
    append_all(root, [result], worker)


def append_all(root: Path, rows: list[Result], worker: str | None = None) -> None:
    """Add lines in order, each file opened once (see `append`)."""
    by_release: dict[str, list[str]] = {}
    for r in rows:
        by_release.setdefault(r.release, []).append(json.dumps(asdict(stamped(r)), sort_keys=True) + "\n")
    for release, lines in by_release.items():
        d = release_dir(root, release)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / (f"results.{worker}.jsonl" if worker else "results.jsonl"), "a") as f:
            f.writelines(lines)


ITEM = ("subject", "check", "geometry", "backends", "cache_dtype", "sparsity")  # what the lines of one item share


def item(line: dict) -> tuple:
    """The item a result line (as JSON) belongs to: every line of one checked item has the same."""
    return tuple(tuple(line.get(f) or ()) if f == "backends" else line.get(f, "") for f in ITEM)


@dataclass(frozen=True)
class Merged:
    """What a merge did to a release's results.jsonl: how many lines each new run added, and per previous run how
    many of its lines they replaced (the items re-checked) and how many stay (not re-checked)."""

    path: Path
    release: str
    added: tuple[tuple[str, int], ...]  # (run, lines), each run once, in file order
    replaced: tuple[tuple[str, int], ...]
    kept: tuple[tuple[str, int], ...]

    def __str__(self) -> str:
        if not self.added:
            return f"{self.release}: no new lines ({self.path} unchanged)"
        new = ", ".join(f"{n:,} line{'s' * (n != 1)} of run {r}" for r, n in self.added)
        done = "replaced " + ", ".join(f"{n:,} of run {r}" for r, n in self.replaced) if self.replaced else "added"
        kept = ", ".join(f"{n:,} line{'s' * (n != 1)} of run {r}" for r, n in self.kept)
        return f"{self.release}: {new} {done}" + (f"; {kept} kept (not re-checked)" if kept else "")


def _runs(lines: list[dict]) -> tuple[tuple[str, int], ...]:
    return tuple(Counter(x.get("run", "") for x in lines).items())


def merge(root: Path, release: str, run: str = "") -> Merged:
    """Fold the per-worker files of `release` into results.jsonl and remove them. Worker names starting with `run`
    only, so that concurrent sessions do not take each other's files. The new lines replace the previous lines of
    the items they check, and the stale and unexercised lines of their subject whose known finding covers any of
    those items; every other line stays. A session that checked nothing of this release (collect-only, deselected)
    changes nothing."""
    d = release_dir(root, release)
    parts = sorted(d.glob(f"results.{run}*.jsonl"))
    out = d / "results.jsonl"
    added = [line for p in parts for line in p.read_text().splitlines() if line.strip()]
    new = [json.loads(line) for line in added]
    old = [(line, json.loads(line)) for line in (out.read_text().splitlines() if out.exists() and new else [])
           if line.strip()]
    items = {item(x) for x in new}
    checked = {(x["subject"], x["check"], x["geometry"], x["sparsity"]) for x in new}

    def rechecked(x: dict) -> bool:
        # A stale or unexercised line names the finding's globs, never one item: it goes when the run checked any
        # item they cover (that run says again what the finding did there).
        return item(x) in items or x.get("outcome") in (STALE, UNEXERCISED) and any(
            s == x.get("subject") and fnmatchcase(c, x.get("check", "")) and fnmatchcase(g, x.get("geometry", ""))
            and fnmatchcase(sp, x.get("sparsity", "")) for s, c, g, sp in checked)

    gone = [x for _, x in old if rechecked(x)]
    kept = [(line, x) for line, x in old if not rechecked(x)]
    if new:
        out.write_text("".join(line + "\n" for line in [line for line, _ in kept] + added))
    for p in parts:
        p.unlink()
    return Merged(out, release, _runs(new), _runs(gone), _runs([x for _, x in kept]))


def read(root: Path, release: str = "*", files: str = "results.jsonl") -> list[Result]:
    """Every merged result under `root` (one results.jsonl per release), or of one release; `files` another name
    pattern (results.*.jsonl: the per-process files of a run not merged yet)."""
    out = []
    for path in sorted(Path(root).glob(f"{release}/{files}")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    body = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{path}:{n}: not a result line: {e}") from None
                if body.get("schema") != SCHEMA:
                    raise ValueError(f"{path}:{n}: a result line of another kvconform (schema "
                                     f"{body.get('schema', 1)}, this one reads {SCHEMA}): re-run the session that "
                                     "wrote it, or remove the file")
                try:
                    out.append(Result(**body))
                except (TypeError, ValueError) as e:
                    raise ValueError(f"{path}:{n}: not a result line: {e}") from None
    return out


def install_error(root: Path, release: str, reason: str) -> Merged:
    """Record that `release` could not be installed (its session's only line) and merge it."""
    run = new_run_id()
    append(root, Result(run=run, release=release, source="install", subject="*", check=checks.INSTALL.name,
                        outcome=Word.INSTALL_ERROR, diagnosis=reason), run)
    return merge(root, release, run)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.results")
    parser.add_argument("outcome", choices=["install-error"])
    parser.add_argument("release")
    parser.add_argument("reason")
    parser.add_argument("--dir", default="results", type=Path)
    args = parser.parse_args(argv)
    print(install_error(args.dir, args.release, args.reason))
    return 0

