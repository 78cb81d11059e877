"""contracts and drift: the session's release contracts could be read, and (live) the release still hands what its
recording says. Its items are the session's releases, not targets: it draws no example."""

from __future__ import annotations

from harness import checks
from harness.checks import Check
from harness.results import Word
from harness.run.implementation import Implementation
from harness.run.releases import ReleaseContracts
from harness.run.session import Session
from harness.run.targets import Target


def judged(r: ReleaseContracts) -> tuple[Check, Word, str]:
    """What release `r`'s line says: the contracts unreadable, or the drift check's outcome (skipped when replayed:
    the recording is the contract, nothing to compare)."""
    if r.error:
        return checks.CONTRACTS, Word.CONTRACT_ERROR, r.error
    if r.source == "replay":
        return checks.DRIFT, Word.SKIPPED, "vLLM not installed: replayed"
    if r.drift:
        return checks.DRIFT, Word.DIFFERS, "; ".join(r.drift)
    return checks.DRIFT, Word.BIT_IDENTICAL, ""


class Contracts(Implementation):
    def targets(self, session: Session) -> list[Target]:
        return []

    def planned(self, session: Session, per_item: int, sample: Target | None) -> str:
        return ""


IMPLEMENTATION = Contracts(checks.CONTRACTS)
