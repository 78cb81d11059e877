"""Subjects: the implementations under test. The harness never fixes a subject's bug for it; it reports.

A subject brings its own K/V split of a release's kv_cache, a paged forward over canonical K/V views
[B, N, H, D] (any strides, innermost stride 1) and a dense forward over contiguous token rows [total_kv, H, D].
Both forwards take q [total_q, num_heads, D] and return the output in the same shape; sequence boundaries come
from the case. Bit-identity between the two is only meaningful with a pinned tile config for both calls.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.cache import Paging
from harness.cases import Case
from harness.contract import Contract


@dataclass(frozen=True)
class TileConfig:
    """Compile-time tiling of a Triton attention kernel: query rows and keys per tile, warps, stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 1


class Subject(Protocol):
    name: str

    def supports(self, case: Case) -> str | None:
        """None when the subject can run `case`, else the reason it cannot."""

    def split(self, kv_cache: torch.Tensor, contract: Contract) -> tuple[torch.Tensor, torch.Tensor]:
        """The subject's own K and V views [B, N, H, D] of a layer's kv_cache laid out per `contract`."""

    def tile_config(self, case: Case) -> TileConfig:
        """The tile config pinned for both calls of the bit-identity lane."""

    def paged_forward(
        self, case: Case, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging,
        tile: TileConfig | None,
    ) -> torch.Tensor:
        """Attention over paged K/V; `tile` None lets the subject autotune."""

    def dense_forward(
        self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | None
    ) -> torch.Tensor:
        """The same attention over contiguous K/V token rows."""


def check_paged_views(case: Case, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Raise ValueError unless K and V are canonical [num_blocks, block_size, kv_heads, head_dim] views for `case`."""
    want = (case.block_size, case.kv_heads, case.head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4 or tuple(t.shape[1:]) != want:
            raise ValueError(
                f"{name} shape {tuple(t.shape)} strides {tuple(t.stride())} is not a [num_blocks, block_size, "
                f"kv_heads, head_dim] view with [block_size, kv_heads, head_dim] = {list(want)}"
            )


SUBJECTS = {"builtin": "harness.subjects.builtin:BuiltinSubject", "modelopt": "harness.subjects.modelopt:ModeloptSubject"}


def load_subject(name: str) -> Subject:
    """The subject registered under `name`, or the class at `module:Class` (imported only when asked for)."""
    if name not in SUBJECTS and ":" not in name:
        raise ValueError(f"unknown subject {name!r}; known: {sorted(SUBJECTS)} or module:Class")
    module, _, cls = SUBJECTS.get(name, name).partition(":")
    return getattr(importlib.import_module(module), cls)()
