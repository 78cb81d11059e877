"""model-transfer: a connector, driven as vLLM drives a KV connector over a whole model, moves exactly the blocks it
is asked for. Built from the model's KV cache config and handed every tensor `register_kv_caches` receives (K/V
layers, Mamba states, latent and indexer caches), it saves the source's blocks of each KV cache group and loads them
at other block ids of another allocation of the model: through the handed tensors, each layer's kernel blocks of a
target manager block hold those of the source manager block, nothing else of them changed, and the save left the
source as it was. Block ids are the scheduler's: manager blocks, one tensor per group, from one pool; a layer's
view is indexed by kernel blocks, `layer.manager_block_size // layer.block_size` of them per manager block where the
release splits them. No id is vLLM's null block: a sliding-window group gets real blocks only (vLLM would hand the
null block for those wholly outside the window), so every block handed must move.

Its targets are the models each release's allocation record holds (harness.handed.model); its examples are seeds
of block moves and source bytes (`Moves`). Live, each side is built with the installed release's own KV cache config
and driven with its VllmConfig current (harness.probe.allocation.planned); a subject that needs them (`needs_vllm`)
is not run in a replay.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import random
from dataclasses import dataclass, field
from functools import cached_property

import torch
from hypothesis import strategies as st

from harness import checks
from harness.checks.outcome import Outcome, compare
from harness.checks.transfer import elsewhere
from harness.contract import ContractError
from harness.draws.strategies import Sizes
from harness.handed import model
from harness.handed.model import Model, models
from harness.probe import allocation
from harness.results import Word
from harness.results.words import count, listed
from harness.run.implementation import Implementation
from harness.run.releases import ReleaseContracts
from harness.run.session import Session, supports_layer
from harness.run.targets import Target
from harness.run.trial import NotRun, SubjectRefused, Trial, Verdict


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
        return dict(backends=tuple(sorted({h.kv.contract.origin.backend_name for h in self.model.kv})),
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
            if all(session.selects(h.kv.contract) for h in m.kv)]


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


def group_moves(groups: int, num_blocks: int, seed: int) -> tuple[tuple[list[int], list[int]], ...]:
    """Per KV cache group, (source, target) manager block ids as the scheduler hands one request's blocks: as many
    in every group (a request covers the same tokens in each, and the groups' manager blocks are one size), from one
    pool, so that no id is in two groups on either side (groups overlay the same bytes), and never block 0 (vLLM's
    null block, BlockPool.null_block, which no request gets). Every id of the pool moves for seed 0, else a seeded
    number per group; each is sent to another id of the pool (harness.checks.transfer.elsewhere)."""
    pool = list(range(1, num_blocks))
    per = len(pool) // groups
    if per < 1 or len(pool) < 2:
        raise ValueError(f"{num_blocks} manager blocks (block 0 the null block) cannot give {groups} groups a "
                         "block each and move it elsewhere")
    rng = random.Random(seed)
    source = rng.sample(pool, groups * (per if seed == 0 else rng.randint(1, per)))
    target = elsewhere(source, pool, rng, seed)
    return tuple((source[g::groups], target[g::groups]) for g in range(groups))


def _ints(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as integers of their width: the bytes written and compared, whatever the view type."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _compared(t: torch.Tensor) -> torch.Tensor:
    """`t` as the bitwise comparison reads it: a raw byte view (a Mamba page of int8) as unsigned bytes."""
    return t.view(torch.uint8) if t.dtype == torch.int8 else t


def _registered(kv_caches: dict[str, torch.Tensor | list[torch.Tensor]]) -> dict[str, torch.Tensor | list]:
    """The handed tensors themselves (the dict and its lists copied, not the tensors): what vLLM's runner keeps and
    reads through, whatever the connector does to the dict it is handed."""
    return {name: list(x) if isinstance(x, list) else x for name, x in kv_caches.items()}


def moved(t: Trial) -> Outcome:
    """The outcome of moving manager blocks of a whole model with the subject as vLLM drives a KV connector (which
    blocks of which group, and the source's bytes: the example's seed): two connectors built from the model's KV
    cache config and its attention layers' values, each registered once with every tensor of its own allocation of
    the model; the source's tensors then written with random bytes and the target's poisoned, through the handed
    tensors (registration may re-point their storage); the source saves its groups' blocks, the target loads the
    payload at other block ids. bit-identical when, through the handed tensors, every layer's kernel blocks of each
    target manager block hold those of its source manager block, nothing else of any handed tensor changed, and the
    save left the source as it was; differs where registration changed a handed tensor's shape or strides (the layer
    reads through it); unsupported where a side refuses the model while it is built or registered (ValueError,
    AssertionError, NotImplementedError: vLLM would not start)."""
    m, seed = t.target.model, t.example.seed
    needs = getattr(t.subject, "needs_vllm", None)
    if needs and t.target.release.source != "live":
        who = getattr(t.subject, "name", type(t.subject).__name__)
        raise NotRun(f"{who} needs vLLM's own classes ({needs}); a replay hands it the recorded stand-in "
                     f"KV cache config (per group its spec's class name, manager block size and page size, not "
                     f"vLLM's spec classes or the rest of their fields): run it live, with vllm=={m.release} "
                     "installed")
    groups = group_moves(len(m.config.kv_cache_groups), m.num_blocks, seed)
    said = ("manager blocks " + "; ".join(f"group {g}: {s} -> {d}" for g, (s, d) in enumerate(groups))
            + f" of {m.num_blocks}")
    device = t.device
    layer = m.kv[0].kv.layer  # a connector runs in its release: its modules and layout setting in force
    ids = [tuple(torch.tensor(x[side], dtype=torch.int64, device=device) for x in groups) for side in (0, 1)]

    def side(stack: contextlib.ExitStack, buffers: list[torch.Tensor]
             ) -> tuple[object, dict[str, tuple[torch.Tensor, ...]]]:
        """A connector registered with `buffers`' tensors, and those tensors by name, as vLLM keeps them; live, built
        with the release's own KV cache config, its VllmConfig current while `stack` is open, as in vLLM's worker."""
        # Each side its own config, as each vLLM process builds its own: a connector may edit what it is handed.
        config = copy.deepcopy(m.config)
        if t.target.release.source == "live":
            try:
                config = model.agreeing(m, stack.enter_context(allocation.planned(m.name))[1])
            except ContractError as e:
                raise Verdict(Outcome(Word.CONTRACT_ERROR, str(e))) from e
        caches = model.kv_caches(m, buffers)
        kept = _registered(caches)
        step = "connector"
        try:
            connector = t.call(t.subject.connector, config, m.layers)
            step = "register_kv_caches"
            t.call(connector.register_kv_caches, caches, layer=layer)
        except Verdict as v:
            # A connector that refuses the model while it is built or registered stops vLLM from starting: no byte
            # moves wrong. It refuses as vLLM does (harness.probe.allocation.REFUSALS); anything else is a fault.
            if isinstance(v.__cause__, allocation.REFUSALS):
                raise SubjectRefused(f"{step}: {v.outcome.diagnosis}") from v.__cause__
            raise
        handed = {h.name: model.handed_tensors(h, kept) for h in m.handed}
        for h in m.handed:
            for i, (x, v) in enumerate(zip(handed[h.name], h.views)):
                shape, strides = list(x.shape), [s * x.element_size() for s in x.stride()]
                if [shape, strides] != [v["shape"], v["stride_bytes"]]:
                    raise Verdict(Outcome(Word.DIFFERS, f"register_kv_caches changed layer {h.name}'s tensor {i} from "
                                          f"shape {v['shape']} byte strides {v['stride_bytes']} to shape {shape} "
                                          f"byte strides {strides}: the layer reads its cache through that tensor",
                                          f"layer={h.name}"))
        return connector, handed

    with contextlib.ExitStack() as stack:
        source, read_source = side(stack, model.allocated(m.allocations, device))
        g = torch.Generator().manual_seed(seed)
        for h in m.handed:
            for x in read_source[h.name]:
                _ints(x).copy_(torch.randint(-2**(8 * x.element_size() - 1), 2**(8 * x.element_size() - 1) - 1,
                                             x.shape, dtype=_ints(x).dtype, generator=g))
        before = {name: tuple(x.clone() for x in xs) for name, xs in read_source.items()}
        payload = t.call(source.save, ids[0], layer=layer)
    for h in m.handed:
        for i, (x, was) in enumerate(zip(read_source[h.name], before[h.name])):
            if changed := int((_ints(x) != _ints(was)).sum()):
                return Outcome(Word.DIFFERS, f"save of {said} changed {changed} elements of layer {h.name}'s "
                                             f"tensor {i} on the source")
    for xs in read_source.values():  # the source's blocks are reused: a payload must own its data
        for x in xs:
            _ints(x).fill_(model.POISON)

    with contextlib.ExitStack() as stack:
        target, read_target = side(stack, model.allocated(m.allocations, device))
        for xs in read_target.values():
            for x in xs:
                _ints(x).fill_(model.POISON)
        t.call(target.load, ids[1], payload, layer=layer)
    if all(bool((_ints(x) == model.POISON).all()) for xs in read_target.values() for x in xs):
        return Outcome(Word.DIFFERS, "after load every element of the target's handed tensors is still the poison "
                                     "they were given: it wrote nothing to them (a private copy?), or only poison (a "
                                     f"payload that aliases the source reads its reused, poisoned blocks) ({said})")
    for h in m.handed:
        src, dst = groups[h.group]
        # A manager block another group loads is that group's page, whatever bytes it shares with this layer's view.
        theirs = {b for g, (_, d) in enumerate(groups) if g != h.group for b in d}
        axes = tuple(a for i, a in enumerate(h.kv.contract.layout.logical) if i != h.block_axis) if h.kv else None
        wants = model.tensors(h, model.allocated(m.allocations, device))
        for i, (got, want, was) in enumerate(zip(read_target[h.name], wants, before[h.name])):
            where = f"layer {h.name}" + (f" tensor {i}" if h.listed else "")
            for s, d in zip(src, dst):
                kernel = h.kernel_blocks[d]
                for j, (ks, kd) in enumerate(zip(h.kernel_blocks[s], kernel)):
                    model.kernel_block(want, h, kd).copy_(model.kernel_block(was, h, ks))
                    o = compare(_compared(model.kernel_block(got, h, kd)), _compared(model.kernel_block(want, h, kd)),
                                f"{where}: kernel block {kd} (block {j} of {len(kernel)} in manager block {d} of group "
                                f"{h.group}) should hold source manager block {s}'s kernel block {ks} ({said})", axes)
                    if o.word != Word.BIT_IDENTICAL:
                        return Outcome(o.word, o.diagnosis, f"layer={h.name} block={d} kernel_block={kd}")
            for manager, kernel in enumerate(h.kernel_blocks):
                if manager in theirs:
                    continue
                for k in kernel:
                    if n := int((_ints(model.kernel_block(got, h, k)) != _ints(model.kernel_block(want, h, k))).sum()):
                        return Outcome(Word.DIFFERS, f"{n} elements of {where}'s kernel block {k}, in manager block "
                                                     f"{manager} of group {h.group}, changed although nothing was "
                                                     f"loaded there ({said})",
                                       f"layer={h.name} block={manager} kernel_block={k}")
    return Outcome(Word.BIT_IDENTICAL)


class ModelTransfer(Implementation):
    def targets(self, session: Session) -> list[ModelTarget]:
        return model_targets(session)

    def examples(self, target: ModelTarget, sizes: Sizes):
        return examples(target.model)

    def explicit(self, target: ModelTarget, sizes: Sizes):
        return explicit(target.model)

    def refusal(self, t: Trial, session: Session) -> str | None:
        """The first K/V layer the subject's `supports_layer` refuses, in its words."""
        return next((f"{h.name}: {why}" for h in t.target.model.kv if (why := t.call(
            supports_layer, session.subject, session.subject_name, h.kv.layer, session.capabilities))), None)

    def read(self, body: dict) -> Moves:
        return Moves.from_json(json.dumps(body))

    def planned(self, session: Session, per_item: int, sample: Target | None) -> str:
        return f"{self.check.name} {per_item}"

    def covered(self, session: Session) -> list[str]:
        return coverage(session)

    def body(self, t: Trial) -> Outcome:
        return moved(t)


IMPLEMENTATION = ModelTransfer(checks.MODEL_TRANSFER)
