"""Results: one JSON line per checked item, under results/<release>/results.jsonl.

A run is one pytest process with its xdist workers; every line it writes carries its id (`run`) and the time the line
was written. Each process appends to its own results.<run>-<worker>.jsonl; the controller merges its run's files
into results.jsonl when it ends, replacing that release's previous run (a run that wrote nothing of a release
leaves the previous one, whose lines keep their own run id).
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
`stale` is not an outcome of a check: it marks a known finding that applied but did not happen.

`python -m harness.results install-error RELEASE REASON [--dir results]` records a failed install.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path



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

    @property
    def passing(self) -> bool:
        """The check held (the only words that count as a pass)."""
        return self.value in PASSING


OUTCOMES = tuple(w.value for w in Word)
PASSING = ("bit-identical", "within-tolerance", "rejected")
STALE = "stale"


@dataclass(frozen=True)
class Result:
    """One checked item. `known` is the id of the known finding that predicted the outcome, if any."""

    release: str
    source: str  # "live" (probed from the installed vLLM), "replay" (recorded fixture), or "install"
    subject: str
    geometry: str  # Contract.name, or "*" for a whole-release outcome
    check: str
    sparsity: str
    outcome: str
    case: str = ""  # digest of the example
    repro: str = ""  # one line that reproduces it
    diagnosis: str = ""
    known: str = ""
    device: str = ""  # where it ran ("cuda:1", "cpu"); "" for whole-release outcomes
    run: str = ""  # the id of the run that wrote it
    time: str = ""  # when it was written (UTC, ISO 8601)
    seconds: float = 0.0  # how long the example took (the subject calls and the comparison)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES + (STALE,):
            raise ValueError(f"unknown outcome {self.outcome!r}; known: {OUTCOMES + (STALE,)}")


def new_run_id() -> str:
    """A run's id: when it started (UTC) and a random part, unique across machines and processes."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def release_dir(root: Path, release: str) -> Path:
    return Path(root) / release


def append(root: Path, result: Result, worker: str | None = None) -> None:
    """Add one line to this worker's file for the result's release (to the merged file when `worker` is None),
    stamped with the time it was written."""
    d = release_dir(root, result.release)
    d.mkdir(parents=True, exist_ok=True)
    stamped = replace(result, time=result.time or datetime.now(timezone.utc).isoformat(timespec="seconds"))
    with open(d / (f"results.{worker}.jsonl" if worker else "results.jsonl"), "a") as f:
        f.write(json.dumps(asdict(stamped), sort_keys=True) + "\n")


def merge(root: Path, release: str, run: str = "") -> Path:
    """Fold the per-worker files of `release` into results.jsonl (replacing the previous run) and remove them.
    Worker names starting with `run` only, so that concurrent sessions do not take each other's files. A session
    that checked nothing of this release (collect-only, deselected) leaves the previous run alone."""
    d = release_dir(root, release)
    parts = sorted(d.glob(f"results.{run}*.jsonl"))
    out = d / "results.jsonl"
    if not parts:
        return out
    out.write_text("".join(p.read_text() for p in parts))
    for p in parts:
        p.unlink()
    return out


def read(root: Path, release: str = "*", files: str = "results.jsonl") -> list[Result]:
    """Every merged result under `root` (one results.jsonl per release), or of one release; `files` another name
    pattern (results.*.jsonl: the per-process files of a run not merged yet)."""
    out = []
    for path in sorted(Path(root).glob(f"{release}/{files}")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append(Result(**json.loads(line)))
                except (TypeError, ValueError) as e:
                    raise ValueError(f"{path}:{n}: not a result line: {e}") from e
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.results")
    parser.add_argument("outcome", choices=["install-error"])
    parser.add_argument("release")
    parser.add_argument("reason")
    parser.add_argument("--dir", default="results", type=Path)
    args = parser.parse_args(argv)
    run = new_run_id()
    result = Result(args.release, "install", "*", "*", "install", "*", args.outcome, diagnosis=args.reason, run=run)
    append(args.dir, result, run)
    print(merge(args.dir, args.release, run))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
