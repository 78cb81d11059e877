"""Known findings per subject (fixtures/known_findings/<subject>.toml), in the spirit of array-api-tests' xfails.

A run is red only on a new finding. An outcome that a known finding predicts is reported (xfail, with the reason and
the finding's id in the results); a known finding that applied to checks run in a session but never happened there
is reported as stale, and one none of whose examples ran there as unexercised. Each entry:

    [[finding]]
    releases = ">=0.26.0"   # PEP 440 specifier over vLLM versions; "*" = all; "main" only by "*" or "main"
    geometry = "packed:*"   # fnmatch glob over Contract.name
    sparsity = "*"          # glob over Sparsity.mode
    check = "bit-identity"  # glob over the check name
    outcome = "differs"     # the expected outcome word (harness.results.OUTCOMES)
    reason = "why, one line"
    link = "URL or issue reference"
    package = "lmcache==0.4.7"  # optional: a finding of a connector package's release, which applies only where
                                # that release is installed (a subject that drives several releases of a package)

The id of an entry is `<subject>#<n>`, n counting entries from 1 in file order.

Known performance findings (the performance lane, harness.performance; never a conformance outcome) sit in the same
file: a paged / dense ratio beyond the band and the threshold that such an entry covers is known, not new.

    performance_threshold = 1.10  # optional (default harness.results.timings.THRESHOLD): the ratio beyond which a cell
    is slower [[performance]]
    releases = "*"            # as above
    geometry = "*"            # as above
    workload = "prefill *"    # glob over harness.performance.WORKLOADS names
    tile = "*"                # glob over "pinned ..." / "autotuned"
    reason = "why, one line (with the measured ratios)"
    link = "where it was measured"

Their ids are `<subject>#perf<n>`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib import metadata, resources
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.results import OUTCOMES
from harness.results.timings import THRESHOLD

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib; tomli is the same parser (a dependency on 3.10 only).
    import tomli as tomllib

DIRECTORY = Path(str(resources.files("harness") / "recorded" / "known_findings"))  # shipped as package data
FIELDS = ("releases", "geometry", "sparsity", "check", "outcome", "reason", "link")
PACKAGE = "package"  # an optional field of a finding
PERFORMANCE_FIELDS = ("releases", "geometry", "workload", "tile", "reason", "link")


class FindingsError(ValueError):
    """A known-findings file that cannot be read as documented."""


@dataclass(frozen=True)
class Finding:
    """One known finding: where it applies (release range, geometry, sparsity, check) and the outcome it predicts."""

    id: str
    releases: str
    geometry: str
    sparsity: str
    check: str
    outcome: str
    reason: str
    link: str

    def in_range(self, release: str) -> bool:
        """The release is in the finding's range (its geometry, sparsity and check aside)."""
        return _release_in(release, self.releases)

    def applies(self, release: str, geometry: str, sparsity: str, check: str) -> bool:
        """The finding speaks about this (release, geometry, sparsity, check), whatever the outcome."""
        return (self.in_range(release) and fnmatchcase(geometry, self.geometry)
                and fnmatchcase(sparsity, self.sparsity) and fnmatchcase(check, self.check))

    def matches(self, release: str, geometry: str, sparsity: str, check: str, outcome: str) -> bool:
        """The finding predicts exactly this outcome here."""
        return outcome == self.outcome and self.applies(release, geometry, sparsity, check)


def _release_in(release: str, spec: str) -> bool:
    if spec == "*":
        return True
    if release == "main" or spec == "main":
        return release == spec
    return Version(release) in SpecifierSet(spec, prereleases=True)


@dataclass(frozen=True)
class SlowFinding:
    """One known performance finding: where it applies (release range, geometry, workload, tile)."""

    id: str
    releases: str
    geometry: str
    workload: str
    tile: str
    reason: str
    link: str

    def applies(self, release: str, geometry: str, workload: str, tile: str) -> bool:
        """The finding speaks about this cell, whatever its ratio."""
        return (_release_in(release, self.releases) and fnmatchcase(geometry, self.geometry)
                and fnmatchcase(workload, self.workload) and fnmatchcase(tile, self.tile))


@dataclass(frozen=True)
class KnownPerformance:
    """A subject's performance threshold and known performance findings."""

    threshold: float
    findings: tuple[SlowFinding, ...]

    def known(self, release: str, geometry: str, workload: str, tile: str) -> SlowFinding | None:
        """The first known performance finding covering this cell, or None."""
        return next((f for f in self.findings if f.applies(release, geometry, workload, tile)), None)


def _table(subject: str, directory: Path) -> tuple[Path, dict]:
    path = directory / f"{subject}.toml"
    if not path.exists():
        return path, {}
    try:
        return path, tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise FindingsError(f"{path}: not valid TOML: {e}") from e


def _entries(path: Path, table: dict, kind: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()
             ) -> list[dict]:
    out = []
    for n, entry in enumerate(table.get(kind, []), 1):
        where = f"{path} {kind} {n}"
        if set(entry) - set(optional) != set(fields):
            raise FindingsError(f"{where}: keys {sorted(entry)}, expected exactly {sorted(fields)}"
                                + (f" (and optionally {', '.join(optional)})" if optional else ""))
        if not all(isinstance(entry[k], str) for k in entry):
            raise FindingsError(f"{where}: every value must be a string, got {entry}")
        if entry["releases"] not in ("*", "main"):
            try:
                SpecifierSet(entry["releases"])
            except InvalidSpecifier as e:
                raise FindingsError(f"{where}: releases {entry['releases']!r} is not a PEP 440 specifier") from e
        out.append(entry)
    return out


def load(subject: str, directory: Path = DIRECTORY) -> tuple[Finding, ...]:
    """The known findings of `subject` (those of a package release other than the installed one left out); none
    when it has no file. A malformed file raises FindingsError."""
    path, table = _table(subject, directory)
    out = []
    for n, entry in enumerate(_entries(path, table, "finding", FIELDS, (PACKAGE,)), 1):
        if entry["outcome"] not in OUTCOMES:
            raise FindingsError(f"{path} finding {n}: outcome {entry['outcome']!r} is not one of {OUTCOMES}")
        package = entry.pop(PACKAGE, None)
        if package is None or installed(package, f"{path} finding {n}"):
            out.append(Finding(id=f"{subject}#{n}", **entry))
    return tuple(out)


def installed(package: str, where: str) -> bool:
    """`package` (`name==X`) is the release of that distribution installed here."""
    name, sep, release = package.partition("==")
    if not sep or not name or not release:
        raise FindingsError(f"{where}: package {package!r} is not `name==release`")
    try:
        return metadata.version(name) == release
    except metadata.PackageNotFoundError:
        return False


def load_performance(subject: str, directory: Path = DIRECTORY) -> KnownPerformance:
    """The performance threshold (`performance_threshold`, else harness.results.timings.THRESHOLD) and known performance
    findings of `subject`. A malformed file raises FindingsError."""
    path, table = _table(subject, directory)
    threshold = table.get("performance_threshold", THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 1.0:
        raise FindingsError(f"{path}: performance_threshold {threshold!r} is not a ratio >= 1.0")
    entries = _entries(path, table, "performance", PERFORMANCE_FIELDS)
    return KnownPerformance(float(threshold), tuple(SlowFinding(id=f"{subject}#perf{n}", **e)
                                                    for n, e in enumerate(entries, 1)))


def match(findings: tuple[Finding, ...], release: str, geometry: str, sparsity: str, check: str,
          outcome: str) -> Finding | None:
    """The first known finding predicting `outcome` here, or None (a new finding, or a pass)."""
    try:
        return next((f for f in findings if f.matches(release, geometry, sparsity, check, outcome)), None)
    except InvalidVersion as e:
        raise FindingsError(f"release {release!r} is not a PEP 440 version nor 'main'") from e
