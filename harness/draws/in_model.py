"""Examples in a whole model's layer views (harness.run.targets.InModel): one of the views the probe recorded on its
grid of sizes, as the release allocated it, and everything about it at exactly its sizes (its blocks, kernel block
size, KV heads and head size, the model's dtype); the rest (batch, heads ratio, sparsity, page order, contents) is
drawn as `strategies.cases` draws it, the batch cut to the view's blocks. Sizes are never made up here: a view the
probe did not record is not drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import strategies as st

from harness.draws.cases import Case
from harness.draws.strategies import AMBIGUOUS_KV_HEADS, CAUSAL, PAGE_ORDERS, Example, Sizes, sequence_mixes, sparsities

if TYPE_CHECKING:  # the views' annotations: what makes them is harness.handed.model's
    from harness.handed.model import LayerView


def fitting(q_lens: tuple[int, ...], kv_lens: tuple[int, ...], block_size: int, pages: int
            ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch's sequences, in order, each kept while their pages fit in `pages`; where not even the first does,
    it alone cut to the pages' tokens: a prefill to a shorter prefill, a chunked prefill to fewer keys (its queries
    fewer than those), a decode to fewer keys."""
    kept, used = [], 0
    for q, kv in zip(q_lens, kv_lens):
        need = -(-kv // block_size)
        if used + need <= pages:
            kept.append((q, kv))
            used += need
    if not kept:
        q, kv = q_lens[0], pages * block_size
        kept = [(kv if q == kv_lens[0] else min(q, kv - 1), kv)]
    return tuple(q for q, _ in kept), tuple(kv for _, kv in kept)


def _dtype(v: LayerView) -> str:
    return str(v.kv.layer.dtype).removeprefix("torch.")


def _placed(v: LayerView, case: Case, page_order: str = "shuffled", page_seed: int = 0) -> Example:
    d = v.kv.dims
    return Example(case, v.kv.contract, d.num_blocks, d.num_layers, d.layer, page_order, page_seed, within=v.within)


@st.composite
def examples(draw, views: tuple[LayerView, ...], sizes: Sizes, mode: str | None = None) -> Example:
    """A case in one of `views`, paged into its blocks in a shuffled, reversed or sequential order."""
    v = draw(st.sampled_from(views))
    d = v.kv.dims
    q_lens, kv_lens = fitting(*draw(sequence_mixes(d.block_size, sizes)), d.block_size, d.num_blocks)
    group = draw(st.sampled_from(sizes.groups))
    case = Case(q_lens, kv_lens, d.kv_heads * group, d.kv_heads, d.head_dim, d.block_size, _dtype(v),
                causal=draw(CAUSAL), sparsity=draw(sparsities(sizes, mode)), seed=draw(st.integers(0, 2**16)))
    return _placed(v, case, draw(st.sampled_from(PAGE_ORDERS)), draw(st.integers(0, 2**16)))


@st.composite
def placements(draw, views: tuple[LayerView, ...]) -> Example:
    """One of `views` as a check that looks at the cache and its layer alone takes it: one token of MHA in it."""
    v = draw(st.sampled_from(views))
    d = v.kv.dims
    return _placed(v, Case((1,), (1,), d.kv_heads, d.kv_heads, d.head_dim, d.block_size, _dtype(v)))


def explicit(views: tuple[LayerView, ...], sizes: Sizes) -> list[tuple[Example, None]]:
    """(example, extra) run first: in each view of the fewest blocks at 2 KV heads (blocks, K/V and heads axes all
    as long), one sequence of every token the blocks hold, paged in reverse so that the last block, beside the bytes
    of another layer, holds tokens."""
    fewest = min(v.kv.dims.num_blocks for v in views)
    out = []
    for v in views:
        d = v.kv.dims
        if d.num_blocks == fewest and d.kv_heads == AMBIGUOUS_KV_HEADS:
            kv = d.num_blocks * d.block_size
            case = Case((1,), (kv,), d.kv_heads * max(sizes.groups), d.kv_heads, d.head_dim, d.block_size, _dtype(v),
                        seed=d.num_blocks)
            out.append((_placed(v, case, "reversed"), None))
    return out
