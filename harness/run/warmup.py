"""The warm-up of a run on CUDA: every kernel variant its examples can draw compiled (harness.device.compiles) in a
thread of the controller, behind the checks that launch no kernel; kernel items wait for its end."""

from __future__ import annotations

import threading

from harness.contract import Contract
from harness.device import compiles
from harness.draws.strategies import warmup_shards
from harness.run.session import Session
from harness.run.targets import geometries
from harness.subjects import FORWARD


class Warming:
    """The warm-up thread of this process and what it ended with."""

    def __init__(self, session: Session, gpus: list[str], processes: int):
        self.warmup: compiles.Warmup | None = None
        self.error = ""
        self.thread = threading.Thread(target=self._body, args=(session, gpus, processes), name="kvconform-warmup",
                                       daemon=True)
        self.thread.start()

    def _body(self, session: Session, gpus: list[str], processes: int) -> None:
        try:
            self.warmup = warm(session, gpus, processes)
            what = self.warmup.describe() if self.warmup else "nothing to warm"
        except BaseException as e:  # noqa: BLE001 - a warm-up never decides an outcome; the examples do
            what = f"warm-up failed ({type(e).__name__}: {e}): examples compile what they need"
            self.error = what
        compiles.warm_ended(session.run, what)

    def lines(self) -> list[str]:
        """What the run's summary says of the warm-up (after `thread` ended)."""
        return ([f"kvconform {self.warmup.describe()}"] if self.warmup else []) + (
            [f"kvconform {self.error}"] if self.error else [])


def warm_contracts(session: Session) -> list[Contract]:
    """One selected geometry per K/V element type that the subject reads: of a geometry, a kernel variant depends
    on that alone (shapes, strides and offsets are runtime values; tests/test_compiles.py checks this against the
    launches of drawn examples)."""
    by_type: dict[object, Contract] = {}
    for t in geometries(session, kernels=True):
        if session.supports(t.release, t.contract) is None:
            by_type.setdefault(t.contract.dtype.view, t.contract)
    return list(by_type.values())


def behind(session: Session, gpus: list[str], processes: int) -> Warming | None:
    """Start the warm-up in a thread of this process and return at once (None when there is nothing to warm):
    the checks that launch no kernel run meanwhile; kernel items first wait for its end (`compiles.await_warmup`)."""
    if FORWARD not in session.capabilities or not warm_contracts(session):
        return None
    return Warming(session, gpus, processes)


def warm(session: Session, gpus: list[str], processes: int) -> compiles.Warmup | None:
    """Compile every kernel variant this session's examples can draw, before the first (see harness.device.compiles)."""
    contracts = warm_contracts(session)
    if not contracts or FORWARD not in session.capabilities:  # a consumer launches no kernel
        return None
    shards = warmup_shards(session.sizes)
    return compiles.warm(session.subject_spec, shards, contracts, gpus, processes,
                         compiles.fingerprint(session.subject, shards, contracts, gpus))
