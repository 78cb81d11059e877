"""What the transfer check draws: examples whose caches are as small as 2 and 3 pages (where a cache's block axis is
as long as a K/V axis and naive layout detection is ambiguous), and which blocks move where.

Every target first runs the ambiguous examples (harness.strategies.ambiguous: 2 KV heads, block_size == head_dim,
two layers of a shared allocation, V's own head dim on a diff-KV contract), each moving every page that holds tokens:
at num_blocks 2 both pages hold tokens and swap places, at num_blocks 3 the last page moves. Generated examples then
come half from one-sequence cases that fit 2 or 3 pages, half from the ordinary strategy (at least 2 pages, so that
every block has another to go to).
"""

from __future__ import annotations

import random
from dataclasses import replace

import torch
from hypothesis import strategies as st

from harness.cache import Paging
from harness.contract import Contract
from harness.strategies import Example, Sizes, ambiguous, cases, examples as placed, num_blocks

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
