"""What the runner asks of a check beyond its declaration (harness.checks.Check): its targets, how its examples are
drawn and read back, what the subject is asked before an example runs, and its body. Each check's answer is a
subclass of `Implementation` in harness/checks/<its suite module, less test_>.py, bound there as `IMPLEMENTATION`
and imported the first time the runner asks (`of`); it overrides what differs from a check that draws placed cases
over each geometry of the session (the defaults here). The runner reads nothing else of a check.
"""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Protocol

from hypothesis import strategies as st

from harness.checks import Check
from harness.checks.outcome import Outcome
from harness.draws.strategies import Example, Sizes, cases, examples
from harness.run.session import Session, supports_layer
from harness.run.targets import InModel, Target, geometries

if TYPE_CHECKING:  # the trial imports this module's Drawn: an annotation here
    from harness.run.trial import Trial

PACKAGE = "harness.checks"


class Drawn(Protocol):
    """An example as the runner handles it: keeps, names and replays it, whatever the check draws."""

    @property
    def mode(self) -> str: ...  # its sparsity mode in result lines ("*": none)

    def digest(self) -> str: ...  # a short stable id of the whole example

    def to_json(self) -> str: ...

    def words(self, extra: object) -> str: ...  # what a REPRO line says of it

    def summary(self, extra: object) -> str: ...  # what a kept example's file says of it, for a reader


class Implementation:
    """A check's targets, draws and body. The defaults: the session's geometries that the check takes, placed cases
    (in the item's one sparsity mode where it has one), no explicit examples, no argument of its own, and the
    subject asked `supports(case)` and `supports_layer(layer)` where the check's needs say it runs forwards or is
    handed a cache."""

    def __init__(self, check: Check):
        self.check = check

    def targets(self, session: Session) -> list[Target]:
        """What the check's items take in `session`."""
        return geometries(session, self.check.kernels)

    def examples(self, target: Target, sizes: Sizes) -> st.SearchStrategy:
        """The strategy of one item's generated examples."""
        return examples([target.contract], sizes, self.cases(sizes, target.mode) if target.mode else None)

    def cases(self, sizes: Sizes, mode: str) -> st.SearchStrategy:
        """The cases of an item of one sparsity mode."""
        return cases(sizes, mode)

    def explicit(self, target: Target, sizes: Sizes) -> list[tuple[Drawn, object]]:
        """(example, argument) pairs run first on every target, in this order."""
        return []

    def extra(self) -> st.SearchStrategy:
        """The strategy of the check's own argument (a trial's `extra`)."""
        return st.none()

    def refusal(self, trial: Trial, session: Session) -> str | None:
        """Why the subject does not take this example, by its own word (None when it does)."""
        supports = getattr(session.subject, "supports", None)  # optional outside kernels
        reason = trial.call(supports, trial.example.case) if self.check.asks_case and supports is not None else None
        if self.check.hands_cache and not reason:
            reason = trial.call(supports_layer, session.subject, session.subject_name, trial.layer,
                                session.capabilities)
        return reason

    def body(self, trial: Trial) -> Outcome:
        """The check itself: the outcome of one example (harness.run.trial.Trial)."""
        raise NotImplementedError(f"{type(self).__name__} ({self.check.name}) has no body")

    def read(self, body: dict) -> Drawn:
        """A kept example read back from its file's `example`."""
        return Example.from_json(json.dumps(body))

    def replayed(self, session: Session, targets: list[Target], geometry: str, example: Drawn) -> list[Target]:
        """The session targets a kept example of `geometry` replays on, among the check's own `targets`
        (`targets(session)`): those of that geometry, that release's own contract of it (its layer is that release's
        setting and backend); of a model layer's, those whose release hands its view (`InModel.holds`)."""
        return [t for t in targets if t.geometry == geometry and (not isinstance(t, InModel) or t.holds(example))]

    def planned(self, session: Session, per_item: int, sample: Target | None) -> str:
        """What the run's header says of the examples an item of the check draws (`per_item` generated)."""
        c = self.check
        explicit = len(self.explicit(sample, session.sizes)) if sample is not None else 0
        return (f"{c.name} {per_item}" + (f" + {explicit} explicit" if explicit else "")
                + (f" (sparsity mode {c.mode} only)" if c.mode else "")
                + (" (vLLM's own CUDA op: live on CUDA only)" if c.launches == "vllm" else ""))

    def covered(self, session: Session) -> list[str]:
        """Lines of the run's coverage of its own targets, beside the geometries' (none where it takes those)."""
        return []


def of(check: Check) -> Implementation:
    """The implementation of `check`: harness.checks.<its suite module, less test_>'s IMPLEMENTATION."""
    if not check.module:
        raise ValueError(f"check {check.name!r} has no suite module: another check records it, nothing implements it")
    name = f"{PACKAGE}.{check.module.removeprefix('test_')}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        raise ValueError(f"check {check.name!r} (suite {check.module}) has no implementation: {name} does not "
                         "exist") from None
    found = getattr(module, "IMPLEMENTATION", None)
    if not isinstance(found, Implementation) or found.check is not check:
        raise ValueError(f"{name}.IMPLEMENTATION is {found!r}, not an Implementation of check {check.name!r}")
    return found


def targets(session: Session, check: Check | None = None) -> list[Target]:
    """What the items of `check` take in `session`; without one, every geometry of the session some check takes."""
    return geometries(session) if check is None else of(check).targets(session)
