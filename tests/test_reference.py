"""The float64 oracle on cases small enough to work out by hand, under each declared sparsity semantics."""

import math

import pytest
import torch

from harness.compare.reference import attention, nm_keep, score_error, skip_tiles
from harness.draws.cases import Case, Sparsity
from harness.subjects import SparsitySemantics


def _case(q_lens, kv_lens, num_heads=1, kv_heads=1, head_dim=1, causal=True, sparsity=Sparsity()):
    # head_dim 1 makes the softmax scale 1, so scores are plain products q*k.
    return Case(q_lens, kv_lens, num_heads, kv_heads, head_dim, block_size=16, causal=causal, sparsity=sparsity)


def test_one_key_gives_its_value():
    case = _case((1,), (1,), head_dim=4)
    q, k, v = torch.randn(1, 1, 4), torch.randn(1, 1, 4), torch.randn(1, 1, 4)
    assert torch.equal(attention(case, q, k, v, 16), v.double())


def test_uniform_scores_average_the_visible_values():
    # q = 0 makes every score 0: each query averages the values it may see.
    case = _case((3,), (3,))
    v = torch.tensor([[[1.0]], [[2.0]], [[6.0]]])
    out = attention(case, torch.zeros(3, 1, 1), torch.randn(3, 1, 1), v, 16)
    assert out.flatten().tolist() == pytest.approx([1.0, 1.5, 3.0])


def test_non_causal_sees_every_key():
    case = _case((3,), (3,), causal=False)
    v = torch.tensor([[[1.0]], [[2.0]], [[6.0]]])
    out = attention(case, torch.zeros(3, 1, 1), torch.randn(3, 1, 1), v, 16)
    assert out.flatten().tolist() == pytest.approx([3.0, 3.0, 3.0])


def test_suffix_queries_sit_at_the_end_of_the_kv_span():
    # Chunked prefill: 2 queries over 4 keys are positions 2 and 3, so they see 3 and 4 keys.
    case = _case((2,), (4,))
    v = torch.tensor([1.0, 2.0, 3.0, 10.0]).reshape(4, 1, 1)
    out = attention(case, torch.zeros(2, 1, 1), torch.randn(4, 1, 1), v, 16)
    assert out.flatten().tolist() == pytest.approx([2.0, 4.0])


def test_sequences_of_a_batch_stay_apart():
    case = _case((1, 1), (2, 1))
    v = torch.tensor([1.0, 3.0, 100.0]).reshape(3, 1, 1)
    out = attention(case, torch.zeros(2, 1, 1), torch.randn(3, 1, 1), v, 16)
    assert out.flatten().tolist() == pytest.approx([2.0, 100.0])


def test_gqa_heads_read_kv_head_h_over_group():
    # 4 query heads over 2 kv heads: heads 0,1 read kv head 0 and heads 2,3 read kv head 1.
    case = _case((1,), (1,), num_heads=4, kv_heads=2)
    v = torch.tensor([[[5.0], [7.0]]])
    out = attention(case, torch.randn(1, 4, 1), torch.randn(1, 2, 1), v, 16)
    assert out.flatten().tolist() == [5.0, 5.0, 7.0, 7.0]


def test_nm_keeps_the_top_n_of_each_group():
    s = torch.tensor([[3.0, 1.0, 2.0, 0.0, 5.0, 5.0, 1.0, 9.0]])
    keep = nm_keep(s, torch.ones_like(s, dtype=torch.bool), n=2, m=4)
    # Group 1 keeps 9 and, of the tied 5s, the lower key 4.
    assert keep.tolist() == [[True, False, True, False, True, False, False, True]]


def test_nm_ties_go_to_the_lower_key():
    s = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    keep = nm_keep(s, torch.ones_like(s, dtype=torch.bool), n=2, m=4)
    assert keep.tolist() == [[True, True, False, False]]


def test_nm_masked_keys_never_count_and_partial_groups_work():
    s = torch.tensor([[9.0, 1.0, 2.0, 0.0, 4.0, 3.0]])
    valid = torch.tensor([[False, True, True, True, True, True]])
    keep = nm_keep(s, valid, n=2, m=4)
    # Group 0 ranks 1, 2, 0 (key 0 is masked, its 9 does not count); group 1 has keys 4, 5 only.
    assert keep.tolist() == [[False, True, True, False, True, True]]


def test_nm_attention_with_sink_and_recent_windows():
    # One query at position 3 over scores [3, 1, 2, 0]: top 2 of 4 keeps keys 0 and 2.
    q, k = torch.ones(1, 1, 1), torch.tensor([3.0, 1.0, 2.0, 0.0]).reshape(4, 1, 1)
    v = torch.tensor([1.0, 10.0, 100.0, 1000.0]).reshape(4, 1, 1)

    def run(sink, recent):
        case = _case((1,), (4,), sparsity=Sparsity("nm", n=2, m=4, sink=sink, recent=recent))
        return attention(case, q, k, v, 16).item()

    e = math.exp
    assert run(0, 0) == pytest.approx((e(3) * 1 + e(2) * 100) / (e(3) + e(2)))
    # recent=1 keeps key 3 (> 3 - 1 is false; > q_pos - recent = 2 is true), sink=2 keeps key 1.
    assert run(0, 1) == pytest.approx((e(3) * 1 + e(2) * 100 + e(0) * 1000) / (e(3) + e(2) + e(0)))
    assert run(2, 0) == pytest.approx((e(3) * 1 + e(1) * 10 + e(2) * 100) / (e(3) + e(1) + e(2)))


def test_skip_softmax_drops_tiles_against_the_running_max_before_them():
    # Tiles of 2: [0, 0] kept (first), [-10, -10] dropped (e^-10 < 0.01), [1, 1] kept (e^1 >= 0.01).
    s = torch.tensor([[0.0, 0.0, -10.0, -10.0, 1.0, 1.0]])
    keep = skip_tiles(s, torch.ones_like(s, dtype=torch.bool), block_n=2, threshold=0.01)
    assert keep.tolist() == [[True, True, False, False, True, True]]


def test_skip_softmax_running_max_includes_kept_tiles_only():
    # Tile [-3] is kept (e^-3 = 0.0498 >= 0.04) and leaves the running max at 0; tile [-5.5] then compares to 0
    # and is dropped, though it is within e^-2.5 of the tile before it.
    s = torch.tensor([[0.0, -3.0, -5.5]])
    keep = skip_tiles(s, torch.ones_like(s, dtype=torch.bool), block_n=1, threshold=0.04)
    assert keep.tolist() == [[True, True, False]]


def test_skip_softmax_attention_drops_the_skipped_values():
    case = _case((1,), (4,), sparsity=Sparsity("skip_softmax", threshold=0.01))
    q, k = torch.ones(1, 1, 1), torch.tensor([0.0, 0.0, -10.0, -10.0]).reshape(4, 1, 1)
    v = torch.tensor([1.0, 3.0, 100.0, 100.0]).reshape(4, 1, 1)
    assert attention(case, q, k, v, 2).item() == pytest.approx(2.0)
    # With one tile of 4 keys nothing is skipped, and the 100s weigh in.
    assert attention(case, q, k, v, 4).item() > 2.0


def test_skip_softmax_per_query_tile_keeps_a_tile_unless_every_row_may_drop_it():
    # One unit of two rows: row 0 may drop tile [-10, -10], row 1 (whose scores there are 0) may not.
    s = torch.tensor([[[0.0, 0.0, -10.0, -10.0], [0.0, 0.0, 0.0, 0.0]]])
    keep = skip_tiles(s, torch.ones_like(s, dtype=torch.bool), block_n=2, threshold=0.01)
    assert keep.all()
    assert skip_tiles(s[:, :1], torch.ones_like(s[:, :1], dtype=torch.bool), 2, 0.01).tolist() == [
        [[True, True, False, False]]]


def test_skip_softmax_running_max_is_the_prefix_max_of_tile_maxima():
    # The lemma the envelope rests on: a dropped tile's max is below the running max, so the running max over kept
    # tiles is the max over all earlier tiles. Checked against a tile-by-tile loop.
    g = torch.Generator().manual_seed(0)
    s = torch.randn(64, 40, generator=g, dtype=torch.float64) * 3
    for threshold in (0.05, 0.3, 0.7, 0.95):
        running = torch.full((64,), float("-inf"), dtype=torch.float64)
        want = torch.zeros_like(s, dtype=torch.bool)
        for lo in range(0, 40, 4):
            tile_max = s[:, lo : lo + 4].amax(-1)
            kept = torch.exp(tile_max - running) >= threshold
            want[:, lo : lo + 4] = kept[:, None]
            running = torch.where(kept, torch.maximum(running, tile_max), running)
        # skip_tiles works in log2 units: scores s / ln 2 make 2^s' = e^s.
        assert torch.equal(skip_tiles(s[:, None] / math.log(2), torch.ones_like(s[:, None], dtype=torch.bool), 4,
                                      threshold)[:, 0], want)


def test_nm_tied_kept_keeps_every_key_tied_with_the_nth():
    s = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    ok = torch.ones_like(s, dtype=torch.bool)
    assert nm_keep(s, ok, n=2, m=4, tied_kept=True).tolist() == [[True, True, True, False]]
    assert nm_keep(s, ok, n=2, m=4).tolist() == [[True, True, False, False]]


def test_nm_recent_window_to_the_query_and_dense_decode_rows():
    # Non-causal, query 0 sits at position 2 of 4 keys scoring [3, 0, 1, 2]; 1:4 keeps key 0. recent=1 adds key 2
    # (its own position) and, with the window running to the kv end, key 3 as well. A decode row keeps key 0 alone,
    # or every key when decode rows are dense.
    q, k = torch.ones(2, 1, 1), torch.tensor([3.0, 0.0, 1.0, 2.0]).reshape(4, 1, 1)
    v = torch.tensor([1.0, 10.0, 100.0, 1000.0]).reshape(4, 1, 1)
    case = _case((2,), (4,), causal=False, sparsity=Sparsity("nm", n=1, m=4, recent=1))
    e = math.exp
    to_query = SparsitySemantics(recent_window="to_query")
    assert attention(case, q, k, v, 16, to_query)[0].item() == pytest.approx(
        (e(3) * 1 + e(1) * 100) / (e(3) + e(1)))
    assert attention(case, q, k, v, 16)[0].item() == pytest.approx(
        (e(3) * 1 + e(1) * 100 + e(2) * 1000) / (e(3) + e(1) + e(2)))
    decode = _case((1,), (4,), sparsity=Sparsity("nm", n=1, m=4))
    dense = attention(_case((1,), (4,)), q[:1], k, v, 16)
    assert torch.equal(attention(decode, q[:1], k, v, 16, SparsitySemantics(nm_dense_decode_rows=True)), dense)
    assert attention(decode, q[:1], k, v, 16).item() == pytest.approx(1.0)


def test_score_error_bound():
    u = 2.0**-24
    assert score_error(128) == 4 * 128 * u / (1 - 128 * u) + 3 * u
    assert score_error(80) == score_error(128)  # the padded head dim
