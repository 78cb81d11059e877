"""transfer: blocks the subject extracts from one cache and injects into a fresh cache of the same contract at other
block ids hold exactly the same K and V there, and nothing else of the target allocation changed (its other pages
and other layers still poisoned); extract leaves the source as it was. For KV offloaders and connectors, which move
blocks through their own views of the cache. Between extract and inject the source blocks are reused (poisoned
again): a payload must own its data, as an offloaded block's must.

What it draws (the relayout check draws the same): examples whose caches are as small as 2 and 3 pages (where a
cache's block axis is as long as a K/V axis and naive layout detection is ambiguous), and which blocks move where.
Every target first runs the ambiguous examples (harness.draws.strategies.ambiguous: 2 KV heads, block_size == head_dim,
two layers of a shared allocation, V's own head dim on a diff-KV contract), each moving every page that holds tokens:
at num_blocks 2 both pages hold tokens and swap places, at num_blocks 3 the last page moves. Generated examples then
come half from one-sequence cases that fit 2 or 3 pages, half from the ordinary strategy (at least 2 pages, so that
every block has another to go to). It takes the views a whole model hands a layer where no geometry has them too
(harness.run.targets.InModel): moved within a poisoned copy of the model's allocation, every other byte of it (the
other layers') verified untouched.
"""

from __future__ import annotations

import random
from dataclasses import replace

import torch
from hypothesis import strategies as st

from harness import checks
from harness.checks.outcome import Outcome, compare
from harness.compare import bits
from harness.contract import Contract, views
from harness.contract.views import poison
from harness.draws import in_model
from harness.draws.strategies import Example, Sizes, ambiguous, cases, num_blocks
from harness.draws.strategies import examples as placed
from harness.handed.cache import Paging
from harness.handed.layer import Layer, in_force
from harness.results import Word
from harness.run.implementation import Implementation
from harness.run.session import Session
from harness.run.targets import InModel, Target, geometries, in_models
from harness.run.trial import Trial

SMALL = (2, 3)


def examples(contracts: list[Contract], sizes: Sizes) -> st.SearchStrategy[Example]:
    """Transfer examples: caches of 2 or 3 pages half the time, never fewer than 2 pages."""
    # One sequence of at most two pages: the cache can be 2 or 3 pages long.
    small = cases(replace(sizes, max_seqs=1, long_len=min(sizes.block_sizes) * 2))
    return st.one_of(placed(contracts, sizes, small, lambda needed: st.sampled_from([n for n in SMALL if n >= needed])),
                     placed(contracts, sizes, pages=lambda needed: num_blocks(max(2, needed))))


def explicit(contract: Contract, sizes: Sizes) -> list[tuple[Example, int]]:
    """(example, seed) run first on every target: the ambiguous examples, every page holding tokens moved (seed 0)."""
    return [(ex, 0) for ex in ambiguous(contract, sizes)]


def seeds() -> st.SearchStrategy[int]:
    """The `extra` of a transfer example: the seed that picks which blocks move where (`block_ids`)."""
    return st.integers(0, 2**16)


def block_ids(paging: Paging, num_blocks: int, seed: int) -> tuple[list[int], list[int]]:
    """(source, target) block ids: a non-empty subset of the pages holding tokens (all of them for seed 0), each
    sent to another block id of a cache of `num_blocks` pages (a fixed-point-free permutation of the block ids)."""
    return moves(sorted({int(b) for b in paging.block_table.flatten().tolist() if b >= 0}), num_blocks, seed)


def moves(used: list[int], num_blocks: int, seed: int) -> tuple[list[int], list[int]]:
    """(source, target) block ids: a non-empty subset of `used` (all of it for seed 0), each sent to another block
    id of `num_blocks` (a fixed-point-free permutation of the block ids)."""
    rng = random.Random(seed)
    source = used if seed == 0 else sorted(rng.sample(used, rng.randint(1, len(used))))
    return source, elsewhere(source, list(range(num_blocks)), rng, seed)


def elsewhere(source: list[int], pool: list[int], rng: random.Random, seed: int) -> list[int]:
    """Each block id of `source` (ids of `pool`) sent to another id of `pool`, by a fixed-point-free permutation of
    the pool: the conjugate of a rotation (by one for seed 0), drawn with `rng`."""
    perm = list(pool)
    rng.shuffle(perm)
    place = {b: i for i, b in enumerate(perm)}
    shift = 1 if seed == 0 else rng.randint(1, len(pool) - 1)
    return [perm[(place[b] + shift) % len(pool)] for b in source]


def storage(kv_cache: torch.Tensor) -> torch.Tensor:
    """The whole allocation behind a layer's kv_cache (every layer and page), flat."""
    return torch.empty(0, dtype=kv_cache.dtype, device=kv_cache.device).set_(kv_cache.untyped_storage())


def moved(t: Trial, to: Contract, to_layer: Layer, refusable: bool = False) -> Outcome:
    """The outcome of moving the trial's blocks with the subject (which ones: its `extra`, the seed of
    `block_ids`): extracted from the example's cache (handed with the trial's layer), the source then poisoned (the
    blocks are reused: a payload must own its data), injected at other block ids into a fresh, poisoned cache of
    contract `to` handed as `to_layer`. bit-identical when every moved block's K and V read through `to`'s views equal
    the source's and nothing else of the target allocation changed; with `refusable`, an inject that raises and leaves
    the target untouched is `rejected` (a refusal)."""
    ex, p = t.example, t.prepare()
    src, dst = block_ids(p.paging, ex.num_blocks, t.extra)
    device, dims = t.device, ex.dims
    source_ids = torch.tensor(src, dtype=torch.int64, device=device)
    target_ids = torch.tensor(dst, dtype=torch.int64, device=device)
    source = storage(p.kv_cache)
    before = source.clone()
    payload = t.call(t.subject.extract, p.kv_cache, t.layer, source_ids)
    if not torch.equal(bits(source), bits(before)):
        changed = int((bits(source) != bits(before)).sum())
        return Outcome(Word.DIFFERS, f"extract of blocks {src} changed {changed} elements of the source cache")
    want_k, want_v = (t[source_ids].clone() for t in views.split(ex.contract, p.kv_cache, dims, ex.within))
    poison(source)

    target = views.allocate(to, dims, ex.case.torch_dtype, device, ex.within)
    moves = f"blocks {src} -> {dst}, num_blocks {ex.num_blocks}"
    if refusable:
        try:
            with in_force(to_layer):
                t.subject.inject(target, to_layer, target_ids, payload)
        except Exception as e:  # noqa: BLE001 - a refusal is an answer; what it left behind is judged
            written = _written(target)
            if written:
                return Outcome(Word.DIFFERS, f"inject raised {type(e).__name__} ({e}) after writing {written} "
                                             f"elements of the target ({moves})")
            return Outcome(Word.REJECTED, f"inject refused: {type(e).__name__}: {e}")
    else:
        t.call(t.subject.inject, target, to_layer, target_ids, payload)
    if not _written(target):
        return Outcome(Word.DIFFERS, "after inject every element of the target allocation is still the poison it was "
                                     "allocated with: inject wrote nothing, or only poison (a payload that aliases the "
                                     f"source reads its reused, poisoned blocks) ({moves})")

    expected = views.allocate(to, dims, ex.case.torch_dtype, device, ex.within)
    ek, ev = views.split(to, expected, dims, ex.within)
    ek[target_ids], ev[target_ids] = want_k, want_v
    got_k, got_v = views.split(to, target, dims, ex.within)
    for name, got, want in (("K", got_k, ek), ("V", got_v, ev)):
        for s, d in zip(src, dst):
            o = compare(got[d], want[d], f"{name} of source block {s} injected at block {d} ({moves}"
                                         + (f", {ex.contract.name} -> {to.name}" if to != ex.contract else "") + ")")
            if o.word != Word.BIT_IDENTICAL:
                return o
    whole, other = bits(storage(target)), bits(storage(expected))
    wrong = (whole != other).nonzero()
    if wrong.numel():
        return Outcome(Word.DIFFERS, f"{wrong.numel()} elements of the target allocation outside the K/V of "
                                     f"blocks {dst} changed (first at {where(to, dims, int(wrong[0]), ex.within)}; "
                                     f"{moves})")
    return Outcome(Word.BIT_IDENTICAL)


def _written(target: torch.Tensor) -> int:
    """Elements of `target`'s allocation that are no longer the poison it was allocated with."""
    return int((bits(storage(target)) != bits(poison(storage(target).clone()))).sum())


def where(contract: Contract, dims, first: int, within: views.InAllocation | None = None) -> str:
    """Where flat element `first` of a `contract` allocation at `dims` lies, in the contract's physical axes (in a
    model's allocation, `within`: its element)."""
    if within is not None:
        return f"element {first} of the model's allocation (the layer's view: {within.view})"
    at = torch.unravel_index(torch.tensor(first), views.physical_shape(contract, dims))
    return ", ".join(f"{a}={int(i)}" for a, i in zip(contract.layout.physical, at))


class Moved(Implementation):
    """A check that moves blocks: small caches half the time, the ambiguous sizes first, a seed of which blocks
    move where as its argument."""

    def examples(self, target: Target, sizes: Sizes):
        return examples([target.contract], sizes)

    def explicit(self, target: Target, sizes: Sizes):
        return explicit(target.contract, sizes)

    def extra(self):
        return seeds()


class Transfer(Moved):
    def targets(self, session: Session) -> list[Target]:
        return geometries(session) + in_models(session)

    def examples(self, target: Target, sizes: Sizes):
        if isinstance(target, InModel):
            return in_model.examples(target.views, sizes)
        return super().examples(target, sizes)

    def explicit(self, target: Target, sizes: Sizes):
        if isinstance(target, InModel):
            return [(ex, 0) for ex, _ in in_model.explicit(target.views, sizes)]
        return super().explicit(target, sizes)

    def body(self, t: Trial) -> Outcome:
        return moved(t, t.example.contract, t.layer)  # the target: another layer of the same layout


IMPLEMENTATION = Transfer(checks.TRANSFER)
