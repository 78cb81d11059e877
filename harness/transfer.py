"""What the transfer check draws: examples whose caches are as small as 2 and 3 pages (where a cache's block axis is
as long as a K/V axis and naive layout detection is ambiguous), and which blocks move where.

Every target first runs the explicit examples (`explicit`): one at num_blocks 2 (both pages hold tokens and swap
places) and one at num_blocks 3, at the largest kv-head count of the sizes (GQA), two layers of a shared allocation
where the contract has one. Generated examples then come half from one-sequence cases that fit 2 or 3 pages, half
from the ordinary strategy (at least 2 pages, so that every block has another to go to).
"""

from __future__ import annotations

import random
from dataclasses import replace

import torch
from hypothesis import strategies as st

from harness.cache import PAGE_ORDERS, Paging
from harness.cases import Case
from harness.contract import Contract
from harness.strategies import Example, Sizes, cases, layers, num_blocks

SMALL = (2, 3)


@st.composite
def _examples(draw, contracts: list[Contract], sizes: Sizes, small: bool) -> Example:
    contract = draw(st.sampled_from(contracts))
    if small:  # one sequence of at most two pages: the cache can be 2 or 3 pages long
        c = draw(cases(replace(sizes, max_seqs=1, long_len=min(sizes.block_sizes) * 2)))
        blocks = draw(st.sampled_from([n for n in SMALL if n >= c.blocks_needed()]))
    else:
        c = draw(cases(sizes))
        blocks = draw(num_blocks(max(2, c.blocks_needed())))
    count, layer = draw(layers(contract))
    return Example(c, contract, blocks, count, layer, page_order=draw(st.sampled_from(PAGE_ORDERS)),
                   page_seed=draw(st.integers(0, 2**16)))


def examples(contracts: list[Contract], sizes: Sizes) -> st.SearchStrategy[Example]:
    """Transfer examples: caches of 2 or 3 pages half the time, never fewer than 2 pages."""
    return st.one_of(_examples(contracts, sizes, True), _examples(contracts, sizes, False))


def explicit(contract: Contract, sizes: Sizes) -> list[tuple[Example, int]]:
    """(example, seed) run first on every target: num_blocks 2 with both pages moved (swapped), and num_blocks 3."""
    bs, kv_heads = min(sizes.block_sizes), max(sizes.kv_heads)
    count, layer = (2, 1) if contract.shared else (1, 0)
    out = []
    for blocks, kv_len in ((2, bs + 1), (3, 1)):
        case = Case((1,), (kv_len,), kv_heads * max(sizes.groups), kv_heads, sizes.head_dims[0], bs,
                    sizes.dtypes[0], seed=blocks)
        out.append((Example(case, contract, blocks, count, layer, page_order="reversed"), 0))
    return out


def seeds() -> st.SearchStrategy[int]:
    """The `extra` of a transfer example: the seed that picks which blocks move where (`block_ids`)."""
    return st.integers(0, 2**16)


def block_ids(paging: Paging, num_blocks: int, seed: int) -> tuple[list[int], list[int]]:
    """(source, target) block ids: a non-empty subset of the pages holding tokens (all of them for seed 0), each
    sent to another block id of a cache of `num_blocks` pages (a fixed-point-free permutation of the block ids)."""
    rng = random.Random(seed)
    used = sorted({int(b) for b in paging.block_table.flatten().tolist() if b >= 0})
    source = used if seed == 0 else sorted(rng.sample(used, rng.randint(1, len(used))))
    perm = list(range(num_blocks))
    rng.shuffle(perm)
    place = {b: i for i, b in enumerate(perm)}
    shift = 1 if seed == 0 else rng.randint(1, num_blocks - 1)  # conjugate of a rotation: no block stays put
    return source, [perm[(place[b] + shift) % num_blocks] for b in source]


def storage(kv_cache: torch.Tensor) -> torch.Tensor:
    """The whole allocation behind a layer's kv_cache (every layer and page), flat."""
    return torch.empty(0, dtype=kv_cache.dtype, device=kv_cache.device).set_(kv_cache.untyped_storage())
