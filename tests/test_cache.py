"""Paging: non-contiguous page assignment with spares, slot mapping, errors on impossible requests, and what a
forward's inputs cost the host on a device (a table read from the host copy, one upload of the batch offsets)."""

import itertools

import pytest
import torch

from harness.handed.cache import paging


def test_pages_are_distinct_and_cover_each_sequence():
    p = paging((1, 16, 17, 40), block_size=16, num_blocks=12, seed=7)
    used = p.block_table[p.block_table >= 0].tolist()
    assert len(used) == len(set(used)) == 1 + 1 + 2 + 3
    assert (p.block_table[0, 1:] == -1).all()
    assert len(p.slot_mapping) == 74 and len(set(p.slot_mapping.tolist())) == 74


def test_slots_follow_the_block_table():
    p = paging((5, 33), block_size=16, num_blocks=6, order="reversed")
    assert p.block_table.tolist() == [[5, -1, -1], [4, 3, 2]]
    assert p.slot_mapping[:5].tolist() == [80, 81, 82, 83, 84]
    assert p.slot_mapping[5 + 16].item() == 3 * 16 and p.slot_mapping[-1].item() == 2 * 16


def test_shuffled_assignment_is_not_contiguous():
    p = paging((256,), block_size=16, num_blocks=32, seed=1)
    pages = p.block_table[0].tolist()
    assert pages != sorted(pages)


def test_too_few_pages_is_an_error_naming_the_request():
    with pytest.raises(ValueError, match=r"kv_lens \(17, 16\) need 3 pages of 16 tokens, the cache has 2"):
        paging((17, 16), block_size=16, num_blocks=2)


def test_unknown_page_order_is_rejected():
    with pytest.raises(ValueError, match="unknown page order 'random'"):
        paging((4,), 16, 2, order="random")


def test_a_paging_moved_off_the_host_keeps_the_table_it_moved():
    p = paging((5, 33), block_size=16, num_blocks=6, order="reversed")
    moved = p.to("meta")  # a device whose tensors hold no values: reading them back would fail
    assert moved.block_table.device.type == "meta" and moved.host_block_table() is p.block_table
    assert moved.to("meta").host_block_table() is p.block_table  # device to device keeps it
    assert p.to("cpu").host_table is None and p.host_block_table().tolist() == [[5, -1, -1], [4, 3, 2]]


def test_the_builtins_table_check_reads_the_kept_host_table_not_the_device():
    from harness.draws.cases import Case
    from harness.subjects.builtin import _check_table

    case = Case((1, 1), (5, 33), 1, 1, 64, 16, "float16")
    moved = paging(case.kv_lens, 16, 6, order="reversed").to("meta")
    _check_table(case, moved, 6)  # no readback of a meta tensor
    with pytest.raises(ValueError, match=r"row 0 \(kv_len 5, 1 pages\) holds pages \[5\] outside the cache's \[0, 4\)"):
        _check_table(case, moved, 4)


def test_batch_offsets_are_one_upload_of_aligned_rows():
    from harness.draws.cases import Case
    from harness.subjects.builtin import batch_tensors

    for batch in range(1, 9):
        case = Case((1,) * batch, tuple(range(3, 3 + batch)), 1, 1, 64, 16, "float16")
        t = batch_tensors(case, torch.device("cpu"))
        assert t.cu_kv.tolist() == [0, *itertools.accumulate(case.kv_lens)] and t.kv_lens.tolist() == list(case.kv_lens)
        assert t.cu_q.tolist() == list(range(batch + 1))
        assert len({x.untyped_storage().data_ptr() for x in (t.cu_q, t.cu_kv, t.kv_lens)}) == 1
        assert all(x.data_ptr() % 16 == 0 for x in (t.cu_q, t.cu_kv, t.kv_lens)), batch
