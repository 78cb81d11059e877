"""Paging: non-contiguous page assignment with spares, slot mapping, and errors on impossible requests."""

import pytest

from harness.cache import paging


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
