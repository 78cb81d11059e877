"""Paging: block tables over shuffled, non-contiguous pages, slot mapping, and token writes through K/V views; host
tensors uploaded to a device without waiting for it.

A slot is `page * block_size + offset`, as in vLLM's `slot_mapping`. Pages no sequence uses stay poisoned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.contract import Contract, Dims, views

PAGE_ORDERS = ("shuffled", "reversed", "sequential")


def upload(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """Host tensor `t` on `device`, without a host wait on CUDA: a copy from pageable memory first waits for the
    device's queue, one from pinned memory is queued like a kernel (torch keeps the pinned block until it ran)."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class Paging:
    """Which page holds which tokens: block_table [batch, max_pages] (-1 past a sequence's end) and slots. A
    Paging that `to` moved off the host keeps the host table it moved (`host_table`): reading a device's table back
    waits for the device. Whoever replaces its block_table replaces that too."""

    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    kv_lens: tuple[int, ...]
    block_size: int
    host_table: torch.Tensor | None = None

    def to(self, device: str | torch.device) -> Paging:
        moved = torch.device(device).type != "cpu"
        host = (self.block_table if self.block_table.device.type == "cpu" else self.host_table) if moved else None
        return Paging(upload(self.block_table, device), upload(self.slot_mapping, device), self.kv_lens,
                      self.block_size, host)

    def host_block_table(self) -> torch.Tensor:
        """block_table on the host: the kept copy where there is one."""
        return self.block_table.cpu() if self.host_table is None else self.host_table


def paging(
    kv_lens: tuple[int, ...], block_size: int, num_blocks: int, order: str = "shuffled", seed: int = 0
) -> Paging:
    """Assign each sequence's pages from a cache of `num_blocks` pages in the given order."""
    if order not in PAGE_ORDERS:
        raise ValueError(f"unknown page order {order!r}; known: {PAGE_ORDERS}")
    counts = [-(-kv // block_size) for kv in kv_lens]
    if sum(counts) > num_blocks:
        raise ValueError(
            f"kv_lens {kv_lens} need {sum(counts)} pages of {block_size} tokens, the cache has {num_blocks}"
        )
    if order == "shuffled":
        pool = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    elif order == "reversed":
        pool = torch.arange(num_blocks - 1, -1, -1)
    else:
        pool = torch.arange(num_blocks)
    table = torch.full((len(kv_lens), max(counts)), -1, dtype=torch.int32)
    slots, start = [], 0
    for row, (kv, count) in enumerate(zip(kv_lens, counts)):
        pages = pool[start : start + count]
        start += count
        table[row, :count] = pages.to(torch.int32)
        pos = torch.arange(kv)
        slots.append(pages[pos // block_size] * block_size + pos % block_size)
    return Paging(table, torch.cat(slots).to(torch.int64), tuple(kv_lens), block_size)


def write(k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store token rows k [total_kv, H, Dk] and v [total_kv, H, Dv] at their slots in canonical views [B, N, H, Dk]
    and [B, N, H, Dv], in place."""
    page, offset = _slots(paging, k_cache.device)
    _indexable(k_cache)[page, offset] = _indexable(k.to(k_cache.dtype))
    _indexable(v_cache)[page, offset] = _indexable(v.to(v_cache.dtype))


def filled(contract: Contract, dims: Dims, paging: Paging, k: torch.Tensor, v: torch.Tensor,
           within: views.InAllocation | None = None) -> torch.Tensor:
    """A layer's kv_cache in `contract`'s geometry (the view `within` a model's allocation, where given) holding token
    rows k [total_kv, H, Dk] and v [total_kv, H, Dv] as its cache dtype stores them (`Contract.stored`) where the
    contract puts them (what vLLM's cache write does); every other element of its allocation poisoned."""
    kv_cache = views.allocate(contract, dims, k.dtype, k.device, within)
    write(*views.split(contract, kv_cache, dims, within), paging, k, v)
    return kv_cache


def read(k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows [total_kv, H, Dk] and [total_kv, H, Dv] gathered back from canonical views through the slot
    mapping."""
    page, offset = _slots(paging, k_cache.device)
    return (_indexable(k_cache)[page, offset].view(k_cache.dtype),
            _indexable(v_cache)[page, offset].view(v_cache.dtype))


def _indexable(t: torch.Tensor) -> torch.Tensor:
    # fp8 as its bytes: the torch releases some vLLM releases pin cannot index fp8 tensors on the CPU.
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


def _slots(paging: Paging, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    slots = paging.slot_mapping.to(device)
    return slots // paging.block_size, slots % paging.block_size
