"""Blocks the subject extracts from one cache and injects into a fresh cache of the same contract at other block ids
hold exactly the same K and V there, and nothing else of the target allocation changed (its other pages and other
layers still poisoned); extract leaves the source as it was. For KV offloaders and connectors, which move blocks
through their own views of the cache. Between extract and inject the source blocks are reused (poisoned again): a
payload must own its data, as an offloaded block's must.

Every geometry runs the explicit examples of harness.transfer first (num_blocks 2 and 3, where the block axis is as
long as a K/V axis), then generated ones, half of them at 2 or 3 pages.
"""

import torch

from harness import checks, transfer
from harness.compare import bits
from harness.contract import poison
from harness.results import Word

CHECK = checks.TRANSFER  # its declaration: what it needs, costs and draws


def _where(ex, first: int) -> str:
    """Where flat element `first` of the allocation lies, in the contract's axes."""
    shape = ex.contract.physical_shape(ex.dims)
    at = torch.unravel_index(torch.tensor(first), shape)
    return ", ".join(f"{a}={int(i)}" for a, i in zip(ex.contract.physical, at))


def check(run, ex, seed):
    p = run.prepare(ex)  # the source: tokens where the contract puts them, other pages poisoned
    src, dst = transfer.block_ids(p.paging, ex.num_blocks, seed)
    device, dims, contract = run.device, ex.dims, ex.contract
    source_ids = torch.tensor(src, dtype=torch.int64, device=device)
    target_ids = torch.tensor(dst, dtype=torch.int64, device=device)
    source = transfer.storage(p.kv_cache)
    before = source.clone()

    layer = run.layer(ex)  # the target cache is another layer's of the same layout
    payload = run.call(run.subject.extract, p.kv_cache, layer, source_ids)
    if not torch.equal(bits(source), bits(before)):
        changed = int((bits(source) != bits(before)).sum())
        return run.outcome(Word.DIFFERS, f"extract of blocks {src} changed {changed} elements of the source cache")
    want_k, want_v = (t[source_ids].clone() for t in contract.split(p.kv_cache, dims))
    poison(source)  # the source blocks are freed and reused: the payload must not alias them

    target = contract.allocate(dims, ex.case.torch_dtype, device)
    run.call(run.subject.inject, target, layer, target_ids, payload)

    expected = contract.allocate(dims, ex.case.torch_dtype, device)
    ek, ev = contract.split(expected, dims)
    ek[target_ids], ev[target_ids] = want_k, want_v
    got_k, got_v = contract.split(target, dims)
    for name, got, want in (("K", got_k, ek), ("V", got_v, ev)):
        for s, d in zip(src, dst):
            o = run.compare(got[d], want[d], f"{name} of source block {s} injected at block {d} "
                                             f"(blocks {src} -> {dst}, num_blocks {ex.num_blocks})")
            if o.word != Word.BIT_IDENTICAL:
                return o
    whole, other = bits(transfer.storage(target)), bits(transfer.storage(expected))
    wrong = (whole != other).nonzero()
    if wrong.numel():
        return run.outcome(Word.DIFFERS, f"{wrong.numel()} elements of the target allocation outside the K/V of "
                                         f"blocks {dst} changed (first at {_where(ex, int(wrong[0]))}; blocks "
                                         f"{src} -> {dst}, num_blocks {ex.num_blocks})")
    return run.outcome(Word.BIT_IDENTICAL)


def test_transfer(conformance, target):
    conformance.run(target, CHECK, check)


def test_transfer_regression(conformance, regression):
    conformance.replay(regression, CHECK, check)
