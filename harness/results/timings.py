"""Performance lines: one JSON line per (subject, release, geometry, workload, tile) the performance lane timed
(harness.performance), under results/<release>/performance.jsonl, apart from the conformance lines: a performance
finding fails `nox -s bench`, never a conformance check. Standard library only (the report reads these).

A cell's ratio is the paged forward's median time over the dense forward's, both over the same tokens. The dense
forward is timed BAND_RUNS times the same way; the band is how far those medians spread (max / min - 1). A ratio
beyond both the band and the subject's threshold (THRESHOLD unless its known-findings file sets
`performance_threshold`) is `slower`; a known performance finding (`[[performance]]` entries of that file,
harness.results.findings) that predicts it makes it known. Words:
  within     paged / dense within max(threshold, 1 + band)
  slower     beyond it: a performance finding (known, or new: `nox -s bench` fails)
  not-timed  the cell could not be timed (the split or the paged forward failed, or paged is not bit-identical to
             dense: the conformance checks report why); never a pass, known when a known finding of the subject
             predicts that failure
  stale      a known performance finding that applied to cells of the run and did not happen
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

WITHIN, SLOWER, NOT_TIMED, STALE = WORDS = ("within", "slower", "not-timed", "stale")
THRESHOLD = 1.10
BAND_RUNS = 5  # times the dense forward is timed to measure the band
REPEATS = 30  # timed calls per run (each after an L2 flush); the median is the run's time
FILE = "performance.jsonl"
SCHEMA = 1


@dataclass(frozen=True, kw_only=True)
class Timing:
    """One performance line: what was timed (run, release, how its contracts were read, subject, geometry,
    workload, tile), its figures in ms, and how it ended."""

    run: str
    time: str = ""
    release: str
    source: str  # "live" or "replay"
    subject: str
    geometry: str  # Contract.name
    backends: tuple[str, ...] = ()
    cache_dtype: str = ""
    workload: str  # harness.performance.WORKLOADS key
    tile: str  # "pinned <tile>" or "autotuned" (the subject's own choice per call)
    outcome: str
    ratio: float = 0.0  # paged median / dense median
    paged_ms: float = 0.0
    paged_spread: float = 0.0  # the paged repeats' p90 / p10 - 1
    dense_ms: float = 0.0  # the median of the dense runs' medians
    band: float = 0.0
    threshold: float = THRESHOLD
    repeats: int = 0
    roofline: str = ""  # decode: KV bytes read per second of the copy rate; prefill: FLOP/s of the matmul rate
    known: str = ""
    diagnosis: str = ""
    device: str = ""
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        if self.outcome not in WORDS:
            raise ValueError(f"unknown performance outcome {self.outcome!r}; known: {WORDS}")
        object.__setattr__(self, "backends", tuple(self.backends))

    @property
    def limit(self) -> float:
        """The ratio beyond which the cell is slower."""
        return limit(self.threshold, self.band)

    @property
    def new_finding(self) -> bool:
        """Slower or not timed, and no known finding predicts it: what fails `nox -s bench`."""
        return self.outcome in (SLOWER, NOT_TIMED) and not self.known


def limit(threshold: float, band: float) -> float:
    """Paged / dense beyond which a cell is slower: beyond the threshold and beyond the dense runs' own spread."""
    return max(threshold, 1.0 + band)


def band(dense_medians: list[float]) -> float:
    """How far repeated dense runs' medians spread: max / min - 1."""
    if len(dense_medians) < 2 or min(dense_medians) <= 0:
        raise ValueError(f"a band needs >= 2 positive dense medians, got {dense_medians}")
    return max(dense_medians) / min(dense_medians) - 1.0


def write(root: Path, rows: list[Timing]) -> list[Path]:
    """Each release's performance.jsonl with these lines in place of the lines of the subjects they time (a run of
    one subject keeps the other subjects' lines)."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    by_release: dict[str, list[Timing]] = {}
    for r in rows:
        by_release.setdefault(r.release, []).append(r if r.time else replace(r, time=stamp))
    written = []
    for release, new in by_release.items():
        path = Path(root) / release / FILE
        subjects = {r.subject for r in new}
        kept = [line for line in (path.read_text().splitlines() if path.exists() else [])
                if line.strip() and json.loads(line).get("subject") not in subjects]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in kept)
                        + "".join(json.dumps(asdict(r), sort_keys=True) + "\n" for r in new))
        written.append(path)
    return written


def read(root: Path) -> list[Timing]:
    """Every performance line under `root` (results/<release>/performance.jsonl); a ValueError naming the file and
    line of one that is not a performance line of this kvconform."""
    out = []
    for path in sorted(Path(root).glob(f"*/{FILE}")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                body = json.loads(line)
                if not isinstance(body, dict):
                    raise ValueError(f"a JSON {type(body).__name__}, not an object")
                if body.get("schema") != SCHEMA:
                    raise ValueError(f"schema {body.get('schema')}, this kvconform reads {SCHEMA}")
                out.append(Timing(**body))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{n}: not a performance line: {e}") from None
    return out
