"""How each check's examples are drawn: the strategy of its examples where it is not harness.strategies.examples, the
explicit examples that run first on every target, and the strategy of the check's own argument. harness.checks
declares the checks with the standard library alone (nox's interpreter and the report read it); this module binds
the checks that draw to the functions that draw for them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness import checks, strategies, transfer
from harness.checks import Check


@dataclass(frozen=True)
class Draws:
    """A check's draws: None where it draws harness.strategies.examples, has no explicit examples, takes no argument;
    the cases of its one-mode items."""

    examples: Callable | None = None  # (contracts, sizes) -> strategy of examples
    explicit: Callable | None = None  # (contract, sizes) -> [(example, argument)], run first
    extra: Callable | None = None  # () -> strategy of the check's own argument
    cases: Callable = strategies.cases  # (sizes, mode) -> strategy of the cases of an item of one sparsity mode


PLACED = Draws(explicit=strategies.explicit)  # every check that hands a subject a cache: the ambiguous sizes first
VIEWED = Draws(strategies.placements, strategies.explicit)  # the checks that look at the views alone
MOVED = Draws(transfer.examples, transfer.explicit, transfer.seeds)
DRAWS = {
    checks.SPLIT_AGREES.name: VIEWED,
    checks.REJECTS_MALFORMED.name: VIEWED,
    checks.TRANSFER.name: MOVED,
    checks.RELAYOUT.name: MOVED,
    checks.BIT_IDENTITY.name: PLACED,
    checks.DETERMINISM.name: PLACED,
    checks.ULP_AUTOTUNED.name: PLACED,
    checks.ORACLE.name: Draws(cases=strategies.oracle_cases),  # its float64 work bounded
}


def of(check: Check) -> Draws:
    """The draws of `check` (none of its own for a check that draws nothing or only the default examples)."""
    return DRAWS.get(check.name, Draws())
