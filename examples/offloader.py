"""Two small KV-cache offloaders as kvconform subjects: consumers that never run attention, only move blocks.

`Offloader` takes K and V (blocks first) from the release's contract, as a consumer that asks vLLM's attention
backend would. `ShapeSniffingOffloader` guesses the layout from the tensor instead: 4 axes is the
packed layout, and a first axis of size 2 is taken for the K/V axis of the kv-first layout. On the blocks-first
layout [num_blocks, 2, ...] with exactly 2 blocks that guess is wrong, and its transfers swap K and V across blocks.

    cd examples && python -m pytest --pyargs kvconform.suites --kvconform-subject offloader:ShapeSniffingOffloader \\
        --kvconform-release 0.22.1 --kvconform-release 0.25.1 --kvconform-release 0.33.0 -k "split or transfer"

runs split-agrees and transfer (python -m puts examples/ on sys.path); the checks that need attention forwards
are not generated for these subjects.
"""

from __future__ import annotations

import torch


def _k_v(kv_cache: torch.Tensor, family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V with blocks first: [B, N, H, D] (kv-first, blocks-first) or [B, H, N, D] (packed)."""
    if family == "packed":  # [B, H, N, 2D]: K is the first half of the last axis
        d = kv_cache.shape[-1] // 2
        return kv_cache[..., :d], kv_cache[..., d:]
    if family == "kv-first":  # [2, B, N, H, D]
        return kv_cache[0], kv_cache[1]
    return kv_cache[:, 0], kv_cache[:, 1]  # blocks-first [B, 2, N, H, D]


class Offloader:
    """Moves blocks to host memory and back through the canonical K and V views the release's contract gives (every
    backend's and cache dtype's: a byte cache moves as bytes)."""

    name = "example-offloader"
    capabilities = frozenset({"split", "transfer"})

    def split(self, kv_cache, contract):
        return contract.split(kv_cache)  # a malformed cache is refused with a ContractError naming shape and contract

    def extract(self, kv_cache, contract, block_ids):
        k, v = self.split(kv_cache, contract)
        return torch.stack([k[block_ids], v[block_ids]]).to("cpu")  # a copy: the blocks are reused after this

    def inject(self, kv_cache, contract, block_ids, payload):
        k, v = self.split(kv_cache, contract)
        k[block_ids] = payload[0].to(kv_cache.device)
        v[block_ids] = payload[1].to(kv_cache.device)


class ShapeSniffingOffloader(Offloader):
    """The same offloader guessing the layout from the tensor's shape: wrong on blocks-first with 2 blocks."""

    name = "example-shape-sniffing-offloader"

    def split(self, kv_cache, contract):
        contract.validate(kv_cache)
        family = "packed" if kv_cache.dim() == 4 else "kv-first" if kv_cache.shape[0] == 2 else "blocks-first"
        k, v = _k_v(kv_cache, family)
        return (k.transpose(1, 2), v.transpose(1, 2)) if family == "packed" else (k, v)
