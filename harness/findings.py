"""Known findings per subject (fixtures/known_findings/<subject>.toml), in the spirit of array-api-tests' xfails.

A run is red only on a new finding. An outcome that a known finding predicts is reported (xfail, with the reason and
the finding's id in the results); a known finding that applied to checks run in a session but never happened there
is reported as stale. Each entry:

    [[finding]]
    releases = ">=0.26.0"   # PEP 440 specifier over vLLM versions; "*" = all; "main" only by "*" or "main"
    geometry = "packed:*"   # fnmatch glob over Contract.name
    sparsity = "*"          # glob over Sparsity.mode
    check = "bit-identity"  # glob over the check name
    outcome = "differs"     # the expected outcome word (harness.results.OUTCOMES)
    reason = "why, one line"
    link = "URL or issue reference"

The id of an entry is `<subject>#<n>`, n counting entries from 1 in file order.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import resources
from fnmatch import fnmatchcase
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.results import OUTCOMES

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib; tomli is the same parser (a dependency on 3.10 only).
    import tomli as tomllib

DIRECTORY = Path(str(resources.files("harness") / "recorded" / "known_findings"))  # shipped as package data
FIELDS = ("releases", "geometry", "sparsity", "check", "outcome", "reason", "link")


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

    def applies(self, release: str, geometry: str, sparsity: str, check: str) -> bool:
        """The finding speaks about this (release, geometry, sparsity, check), whatever the outcome."""
        return (_release_in(release, self.releases) and fnmatchcase(geometry, self.geometry)
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


def load(subject: str, directory: Path = DIRECTORY) -> tuple[Finding, ...]:
    """The known findings of `subject`; none when it has no file. A malformed file raises FindingsError."""
    path = directory / f"{subject}.toml"
    if not path.exists():
        return ()
    try:
        entries = tomllib.loads(path.read_text()).get("finding", [])
    except tomllib.TOMLDecodeError as e:
        raise FindingsError(f"{path}: not valid TOML: {e}") from e
    out = []
    for n, entry in enumerate(entries, 1):
        where = f"{path} finding {n}"
        if set(entry) != set(FIELDS):
            raise FindingsError(f"{where}: keys {sorted(entry)}, expected exactly {sorted(FIELDS)}")
        if not all(isinstance(entry[k], str) for k in FIELDS):
            raise FindingsError(f"{where}: every value must be a string, got {entry}")
        if entry["outcome"] not in OUTCOMES:
            raise FindingsError(f"{where}: outcome {entry['outcome']!r} is not one of {OUTCOMES}")
        if entry["releases"] not in ("*", "main"):
            try:
                SpecifierSet(entry["releases"])
            except InvalidSpecifier as e:
                raise FindingsError(f"{where}: releases {entry['releases']!r} is not a PEP 440 specifier") from e
        out.append(Finding(id=f"{subject}#{n}", **entry))
    return tuple(out)


def match(findings: tuple[Finding, ...], release: str, geometry: str, sparsity: str, check: str,
          outcome: str) -> Finding | None:
    """The first known finding predicting `outcome` here, or None (a new finding, or a pass)."""
    try:
        return next((f for f in findings if f.matches(release, geometry, sparsity, check, outcome)), None)
    except InvalidVersion as e:
        raise FindingsError(f"release {release!r} is not a PEP 440 version nor 'main'") from e
