"""The built-in subject: one FlashAttention-2 style Triton forward over paged or dense K/V, with sparsity.

Paged and dense mode differ only in where a key's row lives (page from the block table vs. token offset); the tile
loop, tile order, masking and arithmetic are the same code, so identical inputs give identical bits. Each program
serves every query head that shares one kv head (GQA packing: tile rows are (query token, head in group) pairs)
and a contiguous range of key tiles (split-KV); partial results are merged by a second kernel in split order.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from harness.contract import cache_dtype
from harness.draws.cases import Case
from harness.handed.cache import Paging, upload
from harness.handed.layer import Layer, kv_views
from harness.subjects import Launched, SparsitySemantics, TileConfig, check_paged_views

HEAD_DIMS = (64, 80, 96, 128, 256)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)  # K/V types read as values times a per-tensor scale of 1
NM_GROUPS = (2, 4, 8, 16)
MODES = {"none": 0, "skip_softmax": 1, "nm": 2}
# The fixed tile set: decode-like batches (every program holds one query token's group of heads) stream K/V with
# deep pipelining; the rest use square tiles, three stages deep too (at two, the loop waits for a tile's copies right
# after issuing them). Head dim 256 halves BLOCK_N to stay within shared memory. docs/kernel.md has the measurements.
DECODE = TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=3)
DECODE_256 = TileConfig(block_m=16, block_n=32, num_warps=4, num_stages=3)
PREFILL = TileConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
PREFILL_256 = TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
TILES = (DECODE, DECODE_256, PREFILL, PREFILL_256)
# Split-KV aims for this many programs; skip-softmax never splits since its decisions follow the running max
# from key 0.
TARGET_PROGRAMS = 1024
MAX_SPLITS = 16
# Triton's CPU interpreter computes bf16 dots wrongly (seen on triton 3.9); there bf16 operands are upcast to fp32
# first, which is exact, so the arithmetic is the same as a bf16 tensor-core dot with fp32 accumulation.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# Runtime integers (lengths, counts, strides, window sizes) never specialise a kernel: Triton would otherwise
# compile a new variant whenever one of them turns divisible by 16 or equal to 1, i.e. for almost every new case.
# What is compiled is the constexprs and the tensors' types alone, a small set that a session warms up once. The one
# fact specialisation gave the compiler, strides divisible by 16 (without it no load is vectorised), is stated instead:
# every stride is a multiple of ALIGN elements (launch refuses others), so every row offset is too.
ALIGN = tl.constexpr(16)
RUNTIME_INTS = ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_kn", "stride_kh",
                "stride_vb", "stride_vn", "stride_vh", "stride_table", "num_heads", "group", "q_tiles", "num_splits",
                "total_rows", "causal", "nm_n", "sink", "recent")


@triton.jit(do_not_specialize=RUNTIME_INTS)
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, out_ptr, part_ptr, stats_ptr, table_ptr, cu_q_ptr, cu_kv_ptr, kv_len_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh, stride_table,
    num_heads, group, q_tiles, num_splits, total_rows, causal,
    scale_log2, log2_threshold, nm_n, sink, recent,
    PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr, MODE: tl.constexpr, NM_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr,
):
    seq = tl.program_id(0) // q_tiles
    q_tile = tl.program_id(0) % q_tiles
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    kv_len = tl.load(kv_len_ptr + seq)
    if q_tile * BLOCK_M >= q_len * group:
        return
    rows = q_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len * group
    tok = rows // group
    head = kv_head * group + rows % group
    # Queries are the last q_len positions of the KV span (chunked prefill, prefix hits, decode).
    q_pos = kv_len - q_len + tok
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    q_rows = tl.multiple_of(q_rows, ALIGN)
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # Causality is a runtime flag, not a constexpr, so that one compiled variant serves both: a row sees keys up to
    # `seen` (its position; every key without causality).
    hi = kv_len
    seen = tl.zeros_like(q_pos) + kv_len
    if causal != 0:
        last_tok = tl.minimum((q_tile * BLOCK_M + BLOCK_M - 1) // group, q_len - 1)
        hi = tl.minimum(kv_len, kv_len - q_len + last_tok + 1)
        seen = q_pos
    n_tiles = tl.cdiv(hi, BLOCK_N)
    per_split = tl.cdiv(n_tiles, num_splits)
    tile_lo = split * per_split
    tile_hi = tl.minimum(n_tiles, tile_lo + per_split)
    a = tl.arange(0, BLOCK_N)
    if PAGED:
        table_row = table_ptr + seq * stride_table
        # Page ids are loaded a tile ahead, into registers: loaded in the tile that uses them, a three-stage pipeline
        # stages them through shared memory, about 70 more instructions a tile on sm_90 (docs/kernel.md).
        page_next = _page_ids(table_row, tile_lo, a, kv_len, BLOCK_N, BLOCK_SIZE)
    else:
        kv_start = tl.load(cu_kv_ptr + seq).to(tl.int64)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for t in range(tile_lo, tile_hi):
        n = t * BLOCK_N + a
        n_ok = n < kv_len
        # Out-of-range keys load as 0 and never touch a page.
        if PAGED:
            page = page_next.to(tl.int64)
            page_next = _page_ids(table_row, t + 1, a, kv_len, BLOCK_N, BLOCK_SIZE)
            # A key's row in its page. Where page size and tile width divide one into the other, the rows repeat
            # every tile and the bracketed terms below are loop-invariant.
            if BLOCK_SIZE % BLOCK_N == 0:
                row = (t % (BLOCK_SIZE // BLOCK_N)) * BLOCK_N + a
            elif BLOCK_N % BLOCK_SIZE == 0:
                row = a % BLOCK_SIZE
            else:
                row = n % BLOCK_SIZE
            k_rows = page * stride_kb + (row * stride_kn + kv_head * stride_kh)
            v_rows = page * stride_vb + (row * stride_vn + kv_head * stride_vh)
        else:
            k_rows = (kv_start + n) * stride_kn + kv_head * stride_kh
            v_rows = (kv_start + n) * stride_vn + kv_head * stride_vh
        k_rows = tl.multiple_of(k_rows, ALIGN)
        v_rows = tl.multiple_of(v_rows, ALIGN)
        # K is read in V's [key, dim] layout, so one page id per key serves both loads.
        k = tl.load(k_ptr + k_rows[:, None] + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(q.dtype)
        s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), DOT_F32) * scale_log2
        valid = row_ok[:, None] & n_ok[None, :]
        valid = valid & (n[None, :] <= seen[:, None])
        if MODE == 2:
            valid = _nm_keep(s, valid, n, q_pos, nm_n, sink, recent, BLOCK_M, BLOCK_N, NM_M)
        s = tl.where(valid, s, float("-inf"))
        tile_max = tl.max(s, 1)
        m_new = tl.maximum(m_i, tile_max)
        if MODE == 1:
            # exp(tile_max - running_max) < threshold, in log2 units, against the max before this tile.
            skip = (tile_max == float("-inf")) | (tile_max - m_i < log2_threshold)
            m_new = tl.where(skip, m_i, m_new)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        if MODE == 1:
            p = tl.where(skip[:, None], 0.0, p)
            alpha = tl.where(skip, 1.0, alpha)
            if tl.min(skip.to(tl.int32), 0) == 0:
                v = tl.load(v_ptr + v_rows[:, None] + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(q.dtype)
                acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], DOT_F32)
        else:
            v = tl.load(v_ptr + v_rows[:, None] + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0).to(q.dtype)
            acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], DOT_F32)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    out_rows = (q_start + tok).to(tl.int64) * num_heads + head
    if num_splits > 1:
        part = split * total_rows + out_rows
        tl.store(part_ptr + part[:, None] * D_PAD + d[None, :], acc, mask=row_ok[:, None])
        tl.store(stats_ptr + part * 2, m_i, mask=row_ok)
        tl.store(stats_ptr + part * 2 + 1, l_i, mask=row_ok)
    else:
        o_rows = tl.multiple_of((q_start + tok).to(tl.int64) * stride_ot + head * stride_oh, ALIGN)
        o = acc / l_i[:, None]
        tl.store(out_ptr + o_rows[:, None] + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _page_ids(table_row, t, a, kv_len, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    # Key tile t's page ids: one entry where a page holds whole tiles, else one per key. Slots past the sequence's
    # last page read that page's entry (the others may be -1 or past the row); their keys load nothing.
    last = (kv_len - 1) // BLOCK_SIZE
    if BLOCK_SIZE % BLOCK_N == 0:
        ids = tl.load(table_row + tl.minimum(t // (BLOCK_SIZE // BLOCK_N), last))
    elif BLOCK_N % BLOCK_SIZE == 0:
        ids = tl.load(table_row + tl.minimum(t * (BLOCK_N // BLOCK_SIZE) + a // BLOCK_SIZE, last))
    else:
        ids = tl.load(table_row + tl.minimum((t * BLOCK_N + a) // BLOCK_SIZE, last))
    return ids


@triton.jit
def _dot(a, b, acc, DOT_F32: tl.constexpr):
    if DOT_F32:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def _nm_keep(s, valid, n, q_pos, nm_n, sink, recent,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NM_M: tl.constexpr):
    # Rank each key inside its aligned group of NM_M keys among the causally valid ones (higher score first, ties
    # to the lower key index); keep ranks < nm_n, plus the sink and recent windows.
    GROUPS: tl.constexpr = BLOCK_N // NM_M
    s3 = tl.reshape(tl.where(valid, s, float("-inf")), (BLOCK_M, GROUPS, NM_M))
    ok3 = tl.reshape(valid.to(tl.int32), (BLOCK_M, GROUPS, NM_M))
    idx = tl.arange(0, NM_M)
    s_j = s3[:, :, :, None]
    s_i = s3[:, :, None, :]
    first = idx[None, None, None, :] < idx[None, None, :, None]
    beats = (ok3[:, :, None, :] != 0) & ((s_i > s_j) | ((s_i == s_j) & first))
    rank = tl.reshape(tl.sum(beats.to(tl.int32), 3), (BLOCK_M, BLOCK_N))
    dense = (n[None, :] < sink) | (n[None, :] > q_pos[:, None] - recent)
    return valid & ((rank < nm_n) | dense)


@triton.jit(do_not_specialize=("total_rows", "num_heads", "stride_ot", "stride_oh", "num_splits"))
def _combine(part_ptr, stats_ptr, out_ptr, total_rows, num_heads, stride_ot, stride_oh, num_splits,
             HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
    # Merge split partials in split order: the same order in paged and dense mode, so the bits match.
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D_PAD)
    m = tl.load(stats_ptr + row * 2)
    for s in range(1, num_splits):
        m = tl.maximum(m, tl.load(stats_ptr + (s * total_rows + row) * 2))
    l = 0.0
    acc = tl.zeros([D_PAD], tl.float32)
    for s in range(0, num_splits):
        part = s * total_rows + row
        w = tl.exp2(tl.load(stats_ptr + part * 2) - m)
        l = l + w * tl.load(stats_ptr + part * 2 + 1)
        acc = acc + w * tl.load(part_ptr + part * D_PAD + d)
    o_row = tl.multiple_of((row // num_heads) * stride_ot + (row % num_heads) * stride_oh, ALIGN)
    tl.store(out_ptr + o_row + d, (acc / l).to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


class BuiltinSubject(Launched):
    """This project's own sparse paged attention (see the module docstring)."""

    name = "builtin"
    sparsity_semantics = SparsitySemantics()  # the oracle's default rules are this kernel's

    def supports(self, case: Case) -> str | None:
        if case.head_dim not in HEAD_DIMS:
            return f"head_dim {case.head_dim} not supported; supported: {HEAD_DIMS}"
        if not (16 <= case.block_size <= 256 and case.block_size % 16 == 0):
            return f"block_size {case.block_size} not supported; supported: 16..256 in steps of 16"
        sp = case.sparsity
        if sp.mode == "nm" and (sp.m not in NM_GROUPS or self.tile_config(case).block_n % sp.m):
            return f"nm group size m={sp.m} not supported; supported: {NM_GROUPS}"
        return None

    def supports_layer(self, layer: Layer) -> str | None:
        stored = cache_dtype(layer.cache_dtype)
        if not stored.values_only:
            return (f"cache dtype {layer.cache_dtype} not supported (scales {stored.scale}); supported: the model "
                    "dtype and per-tensor fp8, read as K/V values times a per-tensor scale of 1")
        return None

    def split(self, kv_cache: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        return kv_views(kv_cache, layer)

    def tile_config(self, case: Case) -> TileConfig:
        group = case.num_heads // case.kv_heads
        decode = max(case.q_lens) * group <= DECODE.block_m
        if case.head_dim == 256:
            return DECODE_256 if decode else PREFILL_256
        return DECODE if decode else PREFILL

    def paged_launch(
        self, case: Case, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging,
        tile: TileConfig | None,
    ) -> Callable[[], torch.Tensor]:
        _check_case(self, case, q, k_cache, v_cache)
        check_paged_views(case, k_cache, v_cache)
        _check_table(case, paging, k_cache.shape[0])
        table, tile = paging.block_table.to(q.device), tile or self.tile_config(case)
        batch = batch_tensors(case, q.device)
        return lambda: launch(case, q, k_cache, v_cache, table, tile, batch)

    def dense_launch(
        self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | None
    ) -> Callable[[], torch.Tensor]:
        _check_case(self, case, q, k, v)
        for name, t in (("k", k), ("v", v)):
            want = (sum(case.kv_lens), case.kv_heads, case.head_dim)
            if tuple(t.shape) != want:
                raise ValueError(f"{name} shape {tuple(t.shape)} is not [total_kv, kv_heads, head_dim] = {list(want)}")
        tile, batch = tile or self.tile_config(case), batch_tensors(case, q.device)
        return lambda: launch(case, q, k, v, None, tile, batch)


def _check_case(subject: BuiltinSubject, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    shapes = f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}"
    reason = subject.supports(case)
    if reason:
        raise ValueError(f"builtin subject cannot run this case: {reason} ({shapes})")
    if q.dtype != case.torch_dtype or k.dtype != v.dtype or k.dtype not in (case.torch_dtype, *FP8):
        raise ValueError(f"q is not the case's {case.dtype}, or k/v are neither that nor one fp8 type {FP8}: {shapes}")
    if len({q.device, k.device, v.device}) != 1:
        raise ValueError(f"q, k, v on different devices {q.device}, {k.device}, {v.device}: {shapes}")
    want = (sum(case.q_lens), case.num_heads, case.head_dim)
    if tuple(q.shape) != want:
        raise ValueError(f"q shape {tuple(q.shape)} is not [total_q, num_heads, head_dim] = {list(want)}: {shapes}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name} innermost (head_dim) stride is {t.stride(-1)}, expected 1: shape {tuple(t.shape)} "
                f"strides {tuple(t.stride())}"
            )


def _check_table(case: Case, paging: Paging, num_blocks: int) -> None:
    table = paging.block_table
    if tuple(paging.kv_lens) != tuple(case.kv_lens) or paging.block_size != case.block_size:
        raise ValueError(
            f"paging for kv_lens {paging.kv_lens} block_size {paging.block_size} does not match the case's "
            f"kv_lens {case.kv_lens} block_size {case.block_size}"
        )
    if table.dim() != 2 or table.shape[0] != len(case.kv_lens) or table.dtype != torch.int32:
        raise ValueError(
            f"block table {tuple(table.shape)} {table.dtype} is not int32 [batch={len(case.kv_lens)}, max_pages]"
        )
    host = paging.host_block_table()
    for seq, kv in enumerate(case.kv_lens):
        need = -(-kv // case.block_size)
        if need > table.shape[1]:
            raise ValueError(
                f"block table {tuple(table.shape)} too short for sequence {seq}: kv_len {kv} needs {need} pages "
                f"of {case.block_size} tokens, the table gives {table.shape[1]}"
            )
        pages = host[seq, :need]
        if pages.min() < 0 or pages.max() >= num_blocks:
            raise ValueError(
                f"block table {tuple(table.shape)} row {seq} (kv_len {kv}, {need} pages) holds pages "
                f"{pages.tolist()} outside the cache's [0, {num_blocks})"
            )


def num_splits(case: Case, tile: TileConfig) -> int:
    """Key-tile ranges per (sequence, q tile, kv head); a function of the case and tile alone, so both modes agree."""
    if case.sparsity.mode == "skip_softmax":
        return 1
    group = case.num_heads // case.kv_heads
    programs = len(case.q_lens) * case.kv_heads * -(-max(case.q_lens) * group // tile.block_m)
    tiles = -(-max(case.kv_lens) // tile.block_n)
    return max(1, min(MAX_SPLITS, -(-TARGET_PROGRAMS // programs), tiles // 2))


@dataclass(frozen=True)
class BatchTensors:
    """Per-sequence offsets on the device: query starts cu_q [batch+1], KV token starts cu_kv [batch+1] (dense
    mode), kv_lens [batch]."""

    cu_q: torch.Tensor
    cu_kv: torch.Tensor
    kv_lens: torch.Tensor


def batch_tensors(case: Case, device: torch.device) -> BatchTensors:
    """The case's sequence boundaries as int32 device tensors (one upload, no host wait)."""
    batch = len(case.q_lens)
    # Rows of one upload, each 16-byte aligned as a tensor of its own is (Triton specialises a pointer on that).
    host = torch.zeros(3, -(-(batch + 1) // 4) * 4, dtype=torch.int32)
    host[0, : batch + 1] = torch.tensor([0, *itertools.accumulate(case.q_lens)])
    host[1, : batch + 1] = torch.tensor([0, *itertools.accumulate(case.kv_lens)])
    host[2, :batch] = torch.tensor(case.kv_lens)
    rows = upload(host, device)
    return BatchTensors(rows[0, : batch + 1], rows[1, : batch + 1], rows[2, :batch])


def constexprs(case: Case, tile: TileConfig, paged: bool) -> dict[str, int | bool]:
    """The attention kernel's compile-time arguments for `case`: with the dtype, all that selects a compiled
    variant (every other argument is a runtime value)."""
    sp = case.sparsity
    return dict(
        # The page size is compile-time (16 values) so splitting a key index into page and offset is a shift or a
        # multiply per key, not a runtime integer division.
        PAGED=paged, BLOCK_SIZE=case.block_size if paged else 1, MODE=MODES[sp.mode],
        NM_M=sp.m if sp.mode == "nm" else 1, HEAD_DIM=case.head_dim, D_PAD=triton.next_power_of_2(case.head_dim),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        DOT_F32=case.dtype == "float32" or (case.dtype == "bfloat16" and INTERPRETED),
    )


def launch(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None,
           tile: TileConfig, batch: BatchTensors) -> torch.Tensor:
    """Run the kernel without validating inputs (the subject's forwards validate, then call this): paged over
    K/V views [B, N, H, D] when `table` is given, else dense over token rows [total_kv, H, D]."""
    if tile not in TILES:
        raise ValueError(f"tile config {tile} is not one of the compiled set {TILES}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if any(st % ALIGN.value for st in t.stride()[:-1]):
            raise ValueError(f"{name} strides {tuple(t.stride())} (shape {tuple(t.shape)}) are not all multiples of "
                             f"{ALIGN.value} elements, which the kernel's vectorised row loads assume")
    paged = table is not None
    dev = q.device
    sp = case.sparsity
    group = case.num_heads // case.kv_heads
    cu_q, cu_kv, kv_lens = batch.cu_q, batch.cu_kv, batch.kv_lens
    total_q = q.shape[0]
    out = torch.empty_like(q)
    splits = num_splits(case, tile)
    d_pad = triton.next_power_of_2(case.head_dim)
    total_rows = total_q * case.num_heads
    if splits > 1:
        part = torch.empty((splits, total_rows, d_pad), dtype=torch.float32, device=dev)
        stats = torch.empty((splits, total_rows, 2), dtype=torch.float32, device=dev)
    else:  # never written; float32 like the split buffers, so that splitting is no compile-time choice
        part = stats = torch.empty(1, dtype=torch.float32, device=dev)
    q_tiles = -(-max(case.q_lens) * group // tile.block_m)
    if paged:
        kb, kn, kh = k.stride(0), k.stride(1), k.stride(2)
        vb, vn, vh = v.stride(0), v.stride(1), v.stride(2)
        table_arg, stride_table = table, table.stride(0)
    else:
        kb, kn, kh = 0, k.stride(0), k.stride(1)
        vb, vn, vh = 0, v.stride(0), v.stride(1)
        table_arg, stride_table = kv_lens, 0
    log2e = 1.4426950408889634
    threshold = sp.threshold if sp.mode == "skip_softmax" else 0.5
    _attn_fwd[(len(case.q_lens) * q_tiles, case.kv_heads, splits)](
        q, k, v, out, part, stats, table_arg, cu_q, cu_kv, kv_lens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        kb, kn, kh, vb, vn, vh, stride_table,
        case.num_heads, group, q_tiles, splits, total_rows, int(case.causal),
        case.scale * log2e, math.log2(threshold), sp.n, sp.sink, sp.recent,
        **constexprs(case, tile, paged), num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    if splits > 1:
        _combine[(total_rows,)](part, stats, out, total_rows, case.num_heads, out.stride(0), out.stride(1), splits,
                                HEAD_DIM=case.head_dim, D_PAD=d_pad)
    return out


TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}


def compiled(case: Case, tile: TileConfig, paged: bool, kv_dtype: torch.dtype, arch: int = 90
             ) -> triton.compiler.CompiledKernel:
    """The attention kernel for `case` compiled ahead of time for CUDA compute capability `arch` (sm_90: H100/H200),
    with no GPU: its `asm` holds the ttgir, ptx and sass a launch on that device would run. Pointers are typed and
    aligned as torch's allocations are; every runtime integer is unspecialised, as at launch."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if kv_dtype not in (case.torch_dtype, *FP8):
        raise ValueError(f"kv dtype {kv_dtype} is neither the case's {case.dtype} nor one fp8 type {FP8}")
    cx = constexprs(case, tile, paged)
    names = [p.name for p in _attn_fwd.params]
    model, kv = TRITON_TYPES[case.torch_dtype], TRITON_TYPES[kv_dtype]
    types = {"q_ptr": model, "k_ptr": kv, "v_ptr": kv, "out_ptr": model, "part_ptr": "fp32", "stats_ptr": "fp32"}
    sig = {n: "constexpr" if p.is_constexpr else
           "fp32" if n in ("scale_log2", "log2_threshold") else
           "*" + types.get(n, "i32") if n.endswith("_ptr") else "i32"
           for n, p in zip(names, _attn_fwd.params)}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
    src = ASTSource(_attn_fwd, sig, {(names.index(k),): v for k, v in cx.items()}, aligned)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": tile.num_warps, "num_stages": tile.num_stages})
