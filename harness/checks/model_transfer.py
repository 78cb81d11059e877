"""model-transfer: a connector handed a whole model's caches, as vLLM's `register_kv_caches` hands them, moves exactly
the manager blocks it is asked for: each layer's kernel blocks of a target manager block, read through the layer's
own view, hold those of the source manager block, and no other byte of the model's allocations changed (overlaid
groups, shared layers, layers not handed, padding); extract leaves the source as it was. Block ids are the
scheduler's (manager blocks); a layer's view is indexed by kernel blocks, `layer.manager_block_size //
layer.block_size` of them per manager block where the release splits them.

Its targets are the models each release's allocation record holds (harness.handed.model); its examples are seeds
of block moves and source bytes (`Moves`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property

import torch
from hypothesis import strategies as st

from harness import checks
from harness.checks.outcome import Outcome, compare
from harness.checks.transfer import moves
from harness.draws.strategies import Sizes
from harness.handed import model
from harness.handed.model import Model, models
from harness.results import Word
from harness.results.words import count, listed
from harness.run.implementation import Implementation
from harness.run.releases import ReleaseContracts
from harness.run.session import Session, supports_layer
from harness.run.targets import Target
from harness.run.trial import Trial


@dataclass(frozen=True)
class ModelTarget(Target):
    """A whole model as a release allocates it; its `contract` the geometry of the layers it hands a connector."""

    model: Model = field(kw_only=True)

    @property
    def geometry(self) -> str:
        """Its name in result lines: `model:<name>`."""
        return self.model.geometry

    @cached_property  # a result line per example asks it; the model's handed layers do not change
    def described(self) -> dict[str, object]:
        """The model's layout, and the backends of the layers it hands."""
        c = self.contract
        return dict(backends=tuple(sorted({h.contract.origin.backend_name for h in self.model.handed})),
                    cache_dtype=c.cache_dtype, family=c.layout.family, order=self.model.layout,
                    layers="cross-layer" if c.layout.shared else "per-layer")


@dataclass(frozen=True)
class Moves:
    """One connector example: which manager blocks of `model` move where, and the source's bytes, from `seed`."""

    model: str
    seed: int
    mode = "*"  # a move takes no sparsity mode

    def digest(self) -> str:
        """A short stable id of the whole example."""
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:12]

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "seed": self.seed}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Moves:
        return cls(**json.loads(text))

    def words(self, extra: object) -> str:
        """What a REPRO line says of it."""
        return f"model={self.model} seed={self.seed}"

    def summary(self, extra: object) -> str:
        """What a kept example's file says of it."""
        return self.words(extra)


def examples(model: Model) -> st.SearchStrategy[Moves]:
    """Examples of `model`: seeds of block moves (harness.checks.transfer.moves) and source bytes."""
    return st.builds(Moves, st.just(model.name), st.integers(0, 2**16))


def explicit(model: Model) -> list[tuple[Moves, None]]:
    """Run first on every model: every manager block moves (seed 0)."""
    return [(Moves(model.name, 0), None)]


def model_targets(session: Session) -> list[ModelTarget]:
    """Every model of each session release whose allocation hands a connector K/V layers that the session selects
    (their backends and cache dtype)."""
    return [ModelTarget(r, m.contract, model=m) for r in session.releases for m in models_of(r)[0]
            if all(session.selects(h.contract) for h in m.handed)]


def models_of(r: ReleaseContracts) -> tuple[list[Model], dict[str, str]]:
    """Release `r`'s models a connector check takes, and why each other model (or "*": the release) is not."""
    return models(r.release, r.allocations, r.contracts, r.recording)


def coverage(session: Session) -> list[str]:
    """Per release, the models the connector check takes and the ones it leaves out (each one's reason is in the
    release's model-transfer not-applicable line), or why it takes none."""
    s = session
    taken: dict[str, list[str]] = {}
    for t in model_targets(s):
        taken.setdefault(t.release.release, []).append(t.model.name)
    out = []
    for r in s.releases:
        found, left = models_of(r)
        if "*" in left:
            out.append(f"{r.release} ({r.source}): {s.subject_name} checks nothing: {left['*']}")
            continue
        names = taken.get(r.release, [])
        parts = [f"{count(len(left), 'model')} ({listed(list(left))}): not taken (why: the release's "
                 "model-transfer not-applicable line)"] if left else []
        unasked = [m.name for m in found if m.name not in names]
        if unasked:
            parts.append(f"{count(len(unasked), 'model')} ({listed(unasked)}): layers of backends or cache dtypes not "
                         "asked for")
        out.append(f"{r.release} ({r.source}): {s.subject_name} checks {count(len(names), 'model')} "
                   f"({listed(names, len(names))})" + ("; not checked: " + "; ".join(parts) if parts else ""))
    return out


def moved(t: Trial) -> Outcome:
    """The outcome of moving manager blocks of a whole model with the subject (which blocks, and the
    source's bytes: the example's seed): extracted from every layer the connector is handed, the source allocations
    then poisoned, injected at other manager block ids into fresh, poisoned allocations of the same model.
    bit-identical when each handed layer's kernel blocks of every target manager block, read through the layer's
    own view, hold those of its source manager block, and no other byte of the allocations changed (overlaid groups,
    shared layers, layers not handed, padding)."""
    m, seed = t.target.model, t.example.seed
    src, dst = moves(list(range(m.num_blocks)), m.num_blocks, seed)
    said = f"manager blocks {src} -> {dst} of {m.num_blocks}"
    device = t.device
    source = model.allocated(m.allocations, device)
    g = torch.Generator().manual_seed(seed)
    for b in source:
        b.copy_(torch.randint(-128, 128, b.shape, dtype=torch.int8, generator=g))
    before = [b.clone() for b in source]
    layers = {h.name: h.layer for h in m.handed}
    source_ids, target_ids = (torch.tensor(x, dtype=torch.int64, device=device) for x in (src, dst))
    payload = t.call(t.subject.extract_blocks, model.kv_caches(m, source), layers, source_ids)
    changed = sum(int((a != b).sum()) for a, b in zip(source, before))
    if changed:
        return Outcome(Word.DIFFERS, f"extract_blocks of {said} changed {changed} bytes of the source allocations")
    for b in source:
        b.fill_(model.POISON)

    target = model.allocated(m.allocations, device)
    t.call(t.subject.inject_blocks, model.kv_caches(m, target), layers, target_ids, payload)
    if all(bool((b == model.POISON).all()) for b in target):
        return Outcome(Word.DIFFERS, "after inject_blocks every byte of the target allocations is still the poison "
                                     "they were allocated with: it wrote nothing, or only poison (a payload that "
                                     f"aliases the source reads its reused, poisoned blocks) ({said})")
    expected = model.allocated(m.allocations, device)
    for h in m.handed:
        want, was = model.tensor(h, expected), model.tensor(h, before)
        for s, d in zip(src, dst):
            for ks, kd in zip(h.kernel_blocks[s], h.kernel_blocks[d]):
                model.kernel_block(want, h, kd).copy_(model.kernel_block(was, h, ks))
    for h in m.handed:
        got, want = model.tensor(h, target), model.tensor(h, expected)
        axes = tuple(a for i, a in enumerate(h.contract.layout.logical) if i != h.block_axis)
        for s, d in zip(src, dst):
            kernel = h.kernel_blocks[d]
            for j, (ks, kd) in enumerate(zip(h.kernel_blocks[s], kernel)):
                o = compare(model.kernel_block(got, h, kd), model.kernel_block(want, h, kd),
                            f"layer {h.name}: kernel block {kd} (block {j} of {len(kernel)} in manager block {d}) "
                            f"should hold source manager block {s}'s kernel block {ks} ({said})", axes)
                if o.word != Word.BIT_IDENTICAL:
                    return Outcome(o.word, o.diagnosis, f"layer={h.name} block={d} kernel_block={kd}")
    for i, (a, b) in enumerate(zip(target, expected)):
        wrong = (a != b).nonzero()
        if wrong.numel():
            first = int(wrong[0])
            at, place = model.owner(m, i, first)
            return Outcome(Word.DIFFERS, f"{wrong.numel()} bytes of allocation {i} outside the moved kernel blocks "
                                         f"changed (first at byte {first}: {at}; {said})", place)
    return Outcome(Word.BIT_IDENTICAL)


class ModelTransfer(Implementation):
    def targets(self, session: Session) -> list[ModelTarget]:
        return model_targets(session)

    def examples(self, target: ModelTarget, sizes: Sizes):
        return examples(target.model)

    def explicit(self, target: ModelTarget, sizes: Sizes):
        return explicit(target.model)

    def refusal(self, t: Trial, session: Session) -> str | None:
        """The first handed layer the subject's `supports_layer` refuses, in its words."""
        return next((f"{h.name}: {why}" for h in t.target.model.handed if (why := t.call(
            supports_layer, session.subject, session.subject_name, h.layer, session.capabilities))), None)

    def read(self, body: dict) -> Moves:
        return Moves.from_json(json.dumps(body))

    def planned(self, session: Session, per_item: int, sample: Target | None) -> str:
        return f"{self.check.name} {per_item}"

    def covered(self, session: Session) -> list[str]:
        return coverage(session)

    def body(self, t: Trial) -> Outcome:
        return moved(t)


IMPLEMENTATION = ModelTransfer(checks.MODEL_TRANSFER)
