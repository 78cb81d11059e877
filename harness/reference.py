"""A float64 PyTorch oracle for sparse attention with the built-in subject's semantics.

Per sequence, the q_len queries are the last positions of the kv_len key span (query t sits at kv_len - q_len + t);
query head h reads kv head h // (num_heads // kv_heads). Causally masked and out-of-range keys never count,
in any sparsity mode.
- nm: keys form aligned groups of m (group g = keys [g*m, (g+1)*m)); a row keeps the n highest-scoring valid keys
  of each group (ties to the lower key index), plus every valid key < sink or > q_pos - recent.
- skip_softmax: key tiles of `block_n` keys aligned at key 0, visited in order; a row drops a tile when
  exp(tile_max - running_max) < threshold, with running_max the max over the tiles it kept before (the first
  tile with a valid key is always kept). A dropped tile adds nothing, not even to the running max.
"""

from __future__ import annotations

import torch

from harness.cases import Case


def attention(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int) -> torch.Tensor:
    """Output [total_q, num_heads, head_dim] in float64 from token rows q, k [total_kv, kv_heads, D], v."""
    group = case.num_heads // case.kv_heads
    outs = []
    q0 = kv0 = 0
    for q_len, kv_len in zip(case.q_lens, case.kv_lens):
        qs = q[q0 : q0 + q_len].double()
        ks = k[kv0 : kv0 + kv_len].double().repeat_interleave(group, dim=1)
        vs = v[kv0 : kv0 + kv_len].double().repeat_interleave(group, dim=1)
        q0, kv0 = q0 + q_len, kv0 + kv_len
        s = torch.einsum("qhd,khd->hqk", qs, ks) * case.scale
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
        keys = torch.arange(kv_len, device=q.device)
        valid = (keys[None, :] <= q_pos[:, None]) if case.causal else torch.ones(q_len, kv_len, dtype=torch.bool,
                                                                                 device=q.device)
        valid = valid.expand_as(s)
        sp = case.sparsity
        if sp.mode == "nm":
            valid = nm_keep(s, valid, sp.n, sp.m) | (valid & _window(q_pos, keys, sp.sink, sp.recent))
        elif sp.mode == "skip_softmax":
            valid = skip_tiles(s, valid, block_n, sp.threshold)
        s = s.masked_fill(~valid, float("-inf"))
        p = torch.softmax(s, dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", p, vs))
    return torch.cat(outs)


def nm_keep(s: torch.Tensor, valid: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The valid keys among the top n of each aligned group of m keys along the last axis."""
    kv_len = s.shape[-1]
    pad = -kv_len % m
    s = torch.nn.functional.pad(s.masked_fill(~valid, float("-inf")), (0, pad), value=float("-inf"))
    ok = torch.nn.functional.pad(valid, (0, pad), value=False)
    s = s.unflatten(-1, (-1, m))
    ok = ok.unflatten(-1, (-1, m))
    idx = torch.arange(m, device=s.device)
    s_j, s_i = s[..., :, None], s[..., None, :]
    # beats[..., j, i]: key i outranks key j (higher score, or equal score and lower index).
    beats = ok[..., None, :] & ((s_i > s_j) | ((s_i == s_j) & (idx[None, :] < idx[:, None])))
    rank = beats.sum(-1)
    return (ok & (rank < n)).flatten(-2)[..., :kv_len]


def _window(q_pos: torch.Tensor, keys: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    return (keys[None, :] < sink) | (keys[None, :] > q_pos[:, None] - recent)


def skip_tiles(s: torch.Tensor, valid: torch.Tensor, block_n: int, threshold: float) -> torch.Tensor:
    """`valid` with the keys of every tile a row skips removed, deciding tile by tile in key order."""
    s = s.masked_fill(~valid, float("-inf"))
    running = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype, device=s.device)
    keep = valid.clone()
    for lo in range(0, s.shape[-1], block_n):
        tile_max = s[..., lo : lo + block_n].amax(-1)
        skip = (tile_max == float("-inf")) | (torch.exp(tile_max - running) < threshold)
        keep[..., lo : lo + block_n] &= ~skip[..., None]
        running = torch.where(skip, running, torch.maximum(running, tile_max))
    return keep
