"""A case: one varlen batch to run through a subject, paged and dense.

Each sequence attends from its q_len queries to its kv_len keys; the queries are the last q_len positions of
the KV span (prefill: q_len == kv_len; chunked prefill / prefix hit: q_len < kv_len; decode: q_len == 1).
Token tensors are concatenated over sequences: q [total_q, num_heads, D], k and v [total_kv, kv_heads, D]
(v [total_kv, kv_heads, Dv] where V has its own head dim, harness.draws.strategies.Example).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
SPARSITY_MODES = ("none", "skip_softmax", "nm")


@dataclass(frozen=True)
class Sparsity:
    """none; skip_softmax (skip a KV tile when exp(tile_max - running_max) < threshold); or nm (keep the top
    n of every m keys per query row, with the first `sink` and the last `recent` keys of each row kept dense)."""

    mode: str = "none"
    threshold: float = 0.0
    n: int = 0
    m: int = 0
    sink: int = 0
    recent: int = 0

    def __post_init__(self) -> None:
        if self.mode not in SPARSITY_MODES:
            raise ValueError(f"unknown sparsity mode {self.mode!r}; known: {SPARSITY_MODES}")
        if self.mode == "skip_softmax" and not 0.0 < self.threshold < 1.0:
            raise ValueError(f"skip_softmax needs 0 < threshold < 1, got {self.threshold}")
        if self.mode == "nm" and not 0 < self.n < self.m:
            raise ValueError(f"nm sparsity needs 0 < n < m, got n={self.n} m={self.m}")
        if min(self.sink, self.recent) < 0:
            raise ValueError(f"sink and recent must be >= 0, got {self.sink}, {self.recent}")


@dataclass(frozen=True)
class Case:
    """One batch: per-sequence lengths, heads, cache geometry sizes, dtype, masking, sparsity, seed."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    num_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype: str = "float16"
    causal: bool = True
    sparsity: Sparsity = field(default_factory=Sparsity)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.q_lens or len(self.q_lens) != len(self.kv_lens):
            raise ValueError(f"q_lens {self.q_lens} and kv_lens {self.kv_lens} must be non-empty and equally long")
        for q, kv in zip(self.q_lens, self.kv_lens):
            if not 1 <= q <= kv:
                raise ValueError(f"each sequence needs 1 <= q_len <= kv_len, got q_len {q} kv_len {kv}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {tuple(DTYPES)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of q, k, v and the output."""
        return DTYPES[self.dtype]

    @property
    def scale(self) -> float:
        """Softmax scale 1/sqrt(head_dim)."""
        return self.head_dim**-0.5

    def blocks_needed(self) -> int:
        """Pages the batch occupies at this block size."""
        return sum(-(-kv // self.block_size) for kv in self.kv_lens)

    def digest(self) -> str:
        """A short stable id of the whole case."""
        return hashlib.sha1(repr(self).encode()).hexdigest()[:12]

    def inputs(self, device: str | torch.device = "cpu", head_dim_v: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Seeded q, k, v token tensors (normal, never zeros), drawn by the device's own generator: the same seed
        gives the same bits on every run on one kind of device (a CPU draw of a GPU-sized batch would cost more
        than the kernels it feeds). v is `head_dim_v` wide where given (a diff-KV cache's V), else head_dim."""
        g = torch.Generator(device=device).manual_seed(self.seed)
        tq, tk = sum(self.q_lens), sum(self.kv_lens)
        return tuple(torch.randn(n, heads, dim, generator=g, device=device).to(self.torch_dtype)
                     for n, heads, dim in ((tq, self.num_heads, self.head_dim), (tk, self.kv_heads, self.head_dim),
                                           (tk, self.kv_heads, head_dim_v or self.head_dim)))
