"""Hypothesis strategies that build valid conformance examples, one small builder per thing.

Compile-time values of a Triton kernel (head dim, block size, sparsity mode and group size, dtype, causal; the tile
config is the subject's pinned choice) come from the small fixed sets of a `Sizes`, since each new combination is a
compile (and the CPU interpreter is slow); runtime values (lengths, batch mix, page assignment, contents, layer
counts, seeds) vary freely. Every builder shrinks towards the small, plain end (short, one sequence, no sparsity).

A consumer that decides the layout from a tensor's shape alone is wrong exactly where two axes have the same size,
so the sizes that make a shape ambiguous are drawn on purpose:
- 2 KV heads (`Sizes.kv_heads` of both devices, drawn by `heads`): a packed [B, N, H=2, 2D] and a [B, N, KV=2, H*D]
  reading have the same shape;
- 2 or 3 pages (`num_blocks`, wherever the batch fits in them): the block axis is as long as the K/V axis;
- block_size == head_dim (`block_sizes`, twice as often as another block size; CPU 64 and GPU 128 are each both a
  head dim and a block size): tokens and head dim swap unseen;
- 2 layers of a shared allocation (`layers`): the layer axis is as long as the K/V axis;
- on a diff-KV contract, V's head dim unlike K's, narrower and wider (`examples`, from `Sizes.diff_kv_dims`): C is
  not two halves, and a V read at K's width is cut short only where V is wider.
`ambiguous` builds the explicit examples where all of these coincide at once; every check that hands a subject a
cache (harness.checks) runs them first on every target, then the generated ones.

What an item draws depends on its seed and these builders alone (`alike`), so that a release installed and the same
release replayed draw the same examples, and a REPRO line from one reproduces against the other.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from functools import cache

import torch
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from harness.contract import Contract, Dims
from harness.contract.views import InAllocation
from harness.draws.cases import SPARSITY_MODES, Case, Sparsity
from harness.handed.cache import PAGE_ORDERS, Paging, paging

AMBIGUOUS_KV_HEADS = 2


@contextlib.contextmanager
def alike() -> Iterator[None]:
    """Draws that depend on the seed and the strategies alone. Hypothesis now and then draws a literal constant of
    the modules loaded from outside site-packages; which of kvconform's are loaded differs live (the probe) and in
    replay, so for the duration it draws from its own constants only."""
    local = getattr(providers, "_get_local_constants", None)
    if local is None:  # a hypothesis without local constants: draws depend on the seed alone already
        yield
        return
    providers._get_local_constants = lambda: providers.Constants()
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = local
        providers.CONSTANTS_CACHE.cache.clear()


@dataclass(frozen=True)
class Sizes:
    """The fixed compile-time sets and the runtime size limits one device can afford. `diff_kv_dims` are the (K's,
    V's) head dims of diff-KV examples, V's unlike K's as the diff-KV backends are used, narrower and wider (a
    consumer that assumes one side is wrong only on the other); the checks that take diff-KV caches launch no
    kernel, so they need not be kernel head dims."""

    head_dims: tuple[int, ...]
    block_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    kv_heads: tuple[int, ...]
    groups: tuple[int, ...]  # num_heads // kv_heads (1 = MHA, >1 = GQA, with kv_heads 1 = MQA)
    nm_groups: tuple[int, ...]  # N:M group size m
    max_seqs: int
    long_len: int  # the "long" KV length; other lengths straddle page boundaries
    diff_kv_dims: tuple[tuple[int, int], ...]
    oracle_work: int  # the most scores (Σ q_len * kv_len * num_heads) of a case the float64 oracle computes

    def __post_init__(self) -> None:
        # The ambiguous examples need each coincidence these sets can give; without one they would silently not be.
        if not set(self.head_dims) & set(self.block_sizes):
            raise ValueError(f"no head dim {self.head_dims} is also a block size {self.block_sizes}: "
                             "block_size == head_dim cannot be drawn")
        if AMBIGUOUS_KV_HEADS not in self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} lack {AMBIGUOUS_KV_HEADS}")
        same = [p for p in self.diff_kv_dims if p[0] == p[1]]
        vs = [v for k, v in self.diff_kv_dims if k == self.coinciding]
        if same or not vs or not min(vs) < self.coinciding < max(vs):
            raise ValueError(f"diff_kv_dims {self.diff_kv_dims} must pair K's head dim with another V head dim "
                             f"(equal: {same}) and hold K's head dim {self.coinciding} (a head dim and a block size) "
                             f"with a narrower and a wider V (has {vs})")

    @property
    def coinciding(self) -> int:
        """The smallest size that is both a head dim and a block size."""
        return min(set(self.head_dims) & set(self.block_sizes))

    @property
    def coinciding_v_dims(self) -> tuple[int, int]:
        """V's head dims of the explicit diff-KV examples, whose K's is `coinciding`: the narrowest and the widest."""
        vs = sorted(v for k, v in self.diff_kv_dims if k == self.coinciding)
        return vs[0], vs[-1]


# CPU interpreter: 80 exercises the masked non-power-of-two head dim; 64 is a head dim and a block size; lengths stay
# a few pages.
CPU = Sizes(head_dims=(64, 80), block_sizes=(16, 32, 64), dtypes=("float16", "bfloat16"), kv_heads=(1, 2),
            groups=(1, 2, 4), nm_groups=(4, 8), max_seqs=3, long_len=100,
            diff_kv_dims=((64, 32), (64, 96), (80, 48)), oracle_work=3 * 100 * 100 * 8)  # any case: never binds
# H200: realistic shapes (32 heads / 8 kv heads / dim 128, KV up to 8k, batches of 8+). One head dim and one N:M
# group size: the built-in kernel has 30 constexpr variants per head dim and K/V element type (mode, tile, paged and
# its block sizes), each a compile of about a second; the other head dims are covered on the CPU. Diff-KV: K 192 /
# V 128 as the diff-KV models use it, and K 128 / V 64 and K 128 / V 192 at the block size 128. The oracle's cases at
# most 2^27 scores, about 0.2 s of its float64 work on an H200 (an unbounded one averages 1.6 s): an 8k prefill of 2
# heads, one of 1,448 tokens at 64 heads, a batch of long decodes at any heads.
GPU = Sizes(head_dims=(128,), block_sizes=(16, 32, 64, 128), dtypes=("float16", "bfloat16"),
            kv_heads=(1, 2, 8), groups=(1, 4, 8), nm_groups=(4,), max_seqs=12, long_len=8192,
            diff_kv_dims=((128, 64), (128, 192), (192, 128)), oracle_work=2**27)

SEQUENCE_KINDS = ("prefill", "chunked", "decode")
SKIP_THRESHOLDS = (0.05, 0.3, 0.7, 0.95)
# (q_len, kv_len) of the warm-up: decode and prefill, each long enough to split the keys, so that every tile config
# a drawn case can meet is compiled, and the kernel that merges split partials.
WARMUP_SHAPES = ((1, 256), (256, 256))


# A strategy is a value: each builder below is built once per argument set and then reused. Hypothesis validates a
# strategy object and works out its labels on its first draw; a builder that made its parts afresh inside every draw
# paid that again for each example (most of an example's drawing time). The draws are the same either way.
@cache
def _sampled(options: tuple) -> st.SearchStrategy:
    return st.sampled_from(options)


@cache
@st.composite
def kv_lengths(draw, block_size: int, long_len: int) -> int:
    """A KV length straddling a page boundary (1, bs-1, bs, bs+1, 2bs+1), long, or anything in between."""
    return draw(_kv_length_choices(block_size, long_len))


@cache
def _kv_length_choices(block_size: int, long_len: int) -> st.SearchStrategy[int]:
    edges = [1, block_size - 1, block_size, block_size + 1, 2 * block_size + 1, long_len]
    return st.one_of(st.sampled_from([e for e in edges if 1 <= e <= long_len]), st.integers(1, long_len))


@cache
def _chunked_kv_lengths(block_size: int, long_len: int) -> st.SearchStrategy[int]:
    return kv_lengths(block_size, long_len).filter(lambda n: n >= 3)


@cache
@st.composite
def sequences(draw, block_size: int, long_len: int, kind: str | None = None) -> tuple[int, int]:
    """(q_len, kv_len) of one prefill (q == kv), chunked prefill / prefix hit (1 < q < kv) or decode (q == 1)."""
    kind = kind or draw(_sampled(SEQUENCE_KINDS))
    if kind == "chunked":
        kv = draw(_chunked_kv_lengths(block_size, long_len))
        return draw(st.integers(2, kv - 1)), kv
    kv = draw(kv_lengths(block_size, long_len))
    return (kv if kind == "prefill" else 1), kv


@cache
@st.composite
def sequence_mixes(draw, block_size: int, sizes: Sizes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(q_lens, kv_lens) of a batch of 1..max_seqs sequences, kinds mixed freely."""
    seqs = draw(_sequence_lists(block_size, sizes.long_len, sizes.max_seqs))
    return tuple(q for q, _ in seqs), tuple(kv for _, kv in seqs)


@cache
def _sequence_lists(block_size: int, long_len: int, max_seqs: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(sequences(block_size, long_len), min_size=1, max_size=max_seqs)


@cache
@st.composite
def heads(draw, sizes: Sizes) -> tuple[int, int]:
    """(num_heads, kv_heads): MHA, GQA or MQA."""
    kv = draw(_sampled(sizes.kv_heads))
    return kv * draw(_sampled(sizes.groups)), kv


@cache
@st.composite
def sparsities(draw, sizes: Sizes, mode: str | None = None) -> Sparsity:
    """none, skip-softmax (threshold varies) or N:M (m fixed per compile; n, sink, recent vary); `mode` fixes which."""
    mode = mode or draw(_sampled(SPARSITY_MODES))
    if mode == "skip_softmax":
        return Sparsity(mode, threshold=draw(_sampled(SKIP_THRESHOLDS)))
    if mode == "nm":
        m = draw(_sampled(sizes.nm_groups))
        return Sparsity(mode, n=draw(st.integers(1, m - 1)), m=m, sink=draw(st.integers(0, 8)),
                        recent=draw(st.integers(0, 16)))
    return Sparsity()


@cache
def block_sizes(sizes: Sizes, head_dim: int) -> st.SearchStrategy[int]:
    """A block size of `sizes`, the one as long as `head_dim` (where there is one) twice as often as each other."""
    return st.sampled_from(_block_size_choices(sizes, head_dim))


def _block_size_choices(sizes: Sizes, head_dim: int) -> tuple[int, ...]:
    return sizes.block_sizes + ((head_dim,) if head_dim in sizes.block_sizes else ())


CAUSAL = st.booleans().map(lambda b: not b)  # shrinks towards causal


@cache
@st.composite
def cases(draw, sizes: Sizes, mode: str | None = None, work: int = 0) -> Case:
    """A valid Case with compile-time values from `sizes` and everything else free (the sparsity mode too, unless
    `mode` is given); with `work`, its batch cut to at most that many scores (`within`)."""
    head_dim = draw(_sampled(sizes.head_dims))
    block_size = draw(block_sizes(sizes, head_dim))
    q_lens, kv_lens = draw(sequence_mixes(block_size, sizes))
    num_heads, kv_heads = draw(heads(sizes))
    if work:
        q_lens, kv_lens = within(q_lens, kv_lens, num_heads, work)
    return Case(
        q_lens, kv_lens, num_heads, kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=draw(_sampled(sizes.dtypes)), causal=draw(CAUSAL),
        sparsity=draw(sparsities(sizes, mode)), seed=draw(st.integers(0, 2**16)),
    )


@cache
def oracle_cases(sizes: Sizes, mode: str) -> st.SearchStrategy[Case]:
    """The cases of one sparsity mode that the float64 oracle judges: `cases`, at most `sizes.oracle_work` scores."""
    return cases(sizes, mode, sizes.oracle_work)


def within(q_lens: tuple[int, ...], kv_lens: tuple[int, ...], num_heads: int, work: int
           ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch's sequences, in order, each kept while the scores so far (q_len * kv_len * num_heads each) stay
    within `work`; where not even the first fits, it alone, shortened to fit: a prefill to a shorter prefill, a
    chunked prefill to fewer queries (a decode at the least). The batch itself where it fits."""
    kept, used = [], 0
    for q, kv in zip(q_lens, kv_lens):
        if used + q * kv * num_heads <= work:
            kept.append((q, kv))
            used += q * kv * num_heads
    if not kept:
        q, kv = q_lens[0], kv_lens[0]
        if q == kv:
            q = kv = math.isqrt(work // num_heads)
        else:
            q = max(1, work // (kv * num_heads))
        kept = [(q, kv)]
    return tuple(q for q, _ in kept), tuple(kv for _, kv in kept)


def warmup_shards(sizes: Sizes) -> list[list[Case]]:
    """Small cases spanning every compile-time choice `cases(sizes)` can draw (head dim, block size, dtype, sparsity
    mode and parameters, decode/prefill tiles, split-KV), grouped so that cases differing only in what a subject may
    compile once (block size, sparsity parameters, causal) share a shard."""
    # N:M first: its kernels take longest to compile, and a pool handing out shards in order then ends evenly.
    sparsities = {"nm": [Sparsity("nm", n=n, m=m) for m in sizes.nm_groups for n in range(1, m)],
                  "skip_softmax": [Sparsity("skip_softmax", threshold=t) for t in SKIP_THRESHOLDS],
                  "none": [Sparsity()]}
    shards = []
    for group in sparsities.values():
        for head_dim in sizes.head_dims:
            for dtype in sizes.dtypes:
                for q, kv in WARMUP_SHAPES:
                    shards.append([Case((q,), (kv,), 1, 1, head_dim, block_size, dtype, causal, sp)
                                   for block_size in sizes.block_sizes for sp in group for causal in (True, False)])
    return shards


# The ways to malform a release's kv_cache (harness.checks.malformed says what each does).
MALFORMATIONS = ("extra-axis", "bad-kv-or-c-size", "strided-innermost", "ignored-physical-order", "swapped-n-h")


@cache
@st.composite
def num_blocks(draw, needed: int) -> int:
    """Pages in the cache: exactly what the batch needs, 2 or 3 where they fit (the sizes that collide with the
    K/V axis and make naive layout detection ambiguous), or a few spare pages (left poisoned)."""
    return draw(_page_counts(needed))


@cache
def _page_counts(needed: int) -> st.SearchStrategy[int]:
    small = [n for n in (2, 3) if n >= needed]
    return st.one_of(st.just(needed), st.sampled_from(small) if small else st.nothing(),
                     st.integers(needed, needed + 4))


@cache
@st.composite
def layers(draw, contract: Contract) -> tuple[int, int]:
    """(num_layers, layer): 1..8 layers for a shared allocation (2, as long as the K/V axis, twice as often as each
    other count), any layer of them; (1, 0) otherwise."""
    if not contract.layout.shared:
        return 1, 0
    count = draw(_sampled((*range(1, 9), 2)))
    return count, draw(st.integers(0, count - 1))


def diff_kv_dims(sizes: Sizes) -> st.SearchStrategy[tuple[int, int]]:
    """(K's head dim, V's head dim) of a diff-KV example, V's narrower or wider than K's."""
    return _sampled(sizes.diff_kv_dims)


@dataclass(frozen=True)
class Example:
    """One conformance example: a case placed in a release's contract geometry with a page assignment; on a diff-KV
    contract V has its own head dim (`head_dim_v`; 0: the case's head_dim, K's); in a whole model's allocation, the
    layer's view `within` it (None: the contract's own allocation)."""

    case: Case
    contract: Contract
    num_blocks: int
    num_layers: int = 1
    layer: int = 0
    page_order: str = "shuffled"  # "reversed" always uses the last page of the cache
    page_seed: int = 0
    head_dim_v: int = 0
    within: InAllocation | None = None

    def __post_init__(self) -> None:
        if self.head_dim_v and not self.contract.diff_kv:
            raise ValueError(f"V head dim {self.head_dim_v} != K head dim {self.case.head_dim} in "
                             f"{self.contract.describe()}, which has one head dim for K and V (not diff-KV)")

    @property
    def dims(self) -> Dims:
        return Dims(self.num_blocks, self.case.block_size, self.case.kv_heads, self.case.head_dim,
                    self.num_layers, self.layer, self.head_dim_v)

    def inputs(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The case's seeded q, k, v token rows, v at V's head dim."""
        return self.case.inputs(device, self.head_dim_v)

    def paging(self) -> Paging:
        return paging(self.case.kv_lens, self.case.block_size, self.num_blocks, self.page_order, self.page_seed)

    @property
    def mode(self) -> str:
        """Its sparsity mode, as result lines name it."""
        return self.case.sparsity.mode

    def words(self, extra: object) -> str:
        """What a REPRO line says of it (with the check's own argument `extra`)."""
        return (f"layers={self.num_layers}/{self.layer} num_blocks={self.num_blocks} "
                f"pages={self.page_order}/{self.page_seed} "
                + (f"head_dim_v={self.head_dim_v} " if self.head_dim_v else "")
                + (f"view={self.within.view} in {self.within.nbytes} bytes " if self.within else "")
                + f"extra={extra!r} {self.case!r}")

    def summary(self, extra: object) -> str:
        """What a kept example's file says of it, for a reader: its case."""
        return repr(self.case)

    def digest(self) -> str:
        """A short stable id of the whole example."""
        return hashlib.sha1(self.to_json().encode()).hexdigest()[:12]

    def to_json(self) -> str:
        """One line of JSON that `from_json` turns back into this exact example."""
        # asdict would turn the contract into a dict of all its fields only for this to replace it.
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["case"], body["contract"] = asdict(self.case), self.contract.to_json()
        if not self.head_dim_v:  # an example of one head dim says nothing of V's, so its line and digest hold only K's
            del body["head_dim_v"]
        if self.within is None:  # likewise an example in the contract's own allocation
            del body["within"]
        else:
            body["within"] = self.within.to_json()
        return json.dumps(body, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Example:
        body = json.loads(text)
        c = body["case"]
        case = Case(**{**c, "q_lens": tuple(c["q_lens"]), "kv_lens": tuple(c["kv_lens"]),
                       "sparsity": Sparsity(**c["sparsity"])})
        within = body.get("within")
        return cls(**{**body, "case": case, "contract": Contract.from_json(body["contract"]),
                      "within": within and InAllocation.from_json(within)})


@st.composite
def examples(draw, contracts: list[Contract], sizes: Sizes, case: st.SearchStrategy[Case] | None = None,
             pages: Callable[[int], st.SearchStrategy[int]] = num_blocks) -> Example:
    """A case in one of `contracts` (every physical order and layer arrangement given; on a diff-KV contract at K and
    V head dims of `diff_kv_dims`), paged into a cache of `pages(needed)` pages in a shuffled, reversed or sequential
    order."""
    contract = draw(st.sampled_from(contracts))  # not _sampled: contracts of two releases can be equal, not the same
    c = draw(case if case is not None else cases(sizes))
    head_dim_v = 0
    if contract.diff_kv:
        head_dim, head_dim_v = draw(diff_kv_dims(sizes))
        c = replace(c, head_dim=head_dim)
    num_layers, layer = draw(layers(contract))
    return Example(
        c, contract, draw(pages(c.blocks_needed())), num_layers, layer,
        page_order=draw(_sampled(PAGE_ORDERS)), page_seed=draw(st.integers(0, 2**16)), head_dim_v=head_dim_v,
    )


@st.composite
def placements(draw, contracts: list[Contract], sizes: Sizes) -> Example:
    """An example for a check that looks at a release's kv_cache and the layer handed with it, not at tokens in it
    (split-agrees, rejects-malformed): what they are made of, the cache's sizes and dtype (one draw), its layers and
    its pages (1 up to what a batch of `sizes` can need, 2 and 3 as often again), and nothing else: the batch is one
    token of MHA, since its lengths, heads ratio, sparsity, contents and page order reach neither the views nor the
    layer. What `examples` reaches of these, it reaches too, and what the views see of a shrunk example is what they
    see of the one `examples` shrinks to."""
    contract = draw(st.sampled_from(contracts))  # not _sampled: see examples
    head_dim, head_dim_v, block_size, kv_heads, dtype = draw(_placed_sizes(sizes, contract.diff_kv))
    num_layers, layer = draw(layers(contract))
    case = Case((1,), (1,), kv_heads, kv_heads, head_dim, block_size, dtype)
    return Example(case, contract, draw(_placed_pages(sizes, block_size)), num_layers, layer, head_dim_v=head_dim_v)


@cache
def _placed_sizes(sizes: Sizes, diff_kv: bool) -> st.SearchStrategy[tuple[int, int, int, int, str]]:
    # (K's head dim, V's (0: K's), block size, kv heads, dtype): ordered as `cases` shrinks them, the block size as
    # long as K's head dim twice as often as each other (block_sizes).
    dims = sizes.diff_kv_dims if diff_kv else tuple((d, 0) for d in sizes.head_dims)
    return st.sampled_from([(k, v, bs, kv, dtype) for k, v in dims
                            for bs in _block_size_choices(sizes, k)
                            for kv in sizes.kv_heads for dtype in sizes.dtypes])


@cache
def _placed_pages(sizes: Sizes, block_size: int) -> st.SearchStrategy[int]:
    most = sizes.max_seqs * -(-sizes.long_len // block_size) + 4  # the most `examples` can page a batch into
    return st.one_of(st.integers(1, most), st.sampled_from((2, 3)))


def ambiguous(contract: Contract, sizes: Sizes) -> list[Example]:
    """The explicit examples of `contract`, where every size that makes a shape-only reading ambiguous coincides:
    2 KV heads (GQA), block_size == head_dim (`Sizes.coinciding`), 2 layers of a shared allocation; at num_blocks 2
    with both pages holding tokens, and at num_blocks 3 with the last page holding the one token; on a diff-KV
    contract V narrower than K in the first and wider in the second (`Sizes.coinciding_v_dims`)."""
    dim = sizes.coinciding
    v_dims = sizes.coinciding_v_dims if contract.diff_kv else (0, 0)
    count, layer = (2, 1) if contract.layout.shared else (1, 0)
    out = []
    for (blocks, kv_len), head_dim_v in zip(((2, dim + 1), (3, 1)), v_dims):
        case = Case((1,), (kv_len,), AMBIGUOUS_KV_HEADS * max(sizes.groups), AMBIGUOUS_KV_HEADS, dim, dim,
                    sizes.dtypes[0], seed=blocks)
        out.append(Example(case, contract, blocks, count, layer, "reversed", head_dim_v=head_dim_v))
    return out


def explicit(contract: Contract, sizes: Sizes) -> list[tuple[Example, None]]:
    """(example, extra) run first on every target of a check with no argument of its own: the ambiguous examples."""
    return [(ex, None) for ex in ambiguous(contract, sizes)]
