"""Bitwise comparison: NaN-aware, -0.0 distinct, and a diagnosis that locates the first mismatch; the view identity
check names each field in which two tensors are not one view."""

import pytest
import torch

from harness.compare import assert_bit_identical, diagnose, view_mismatch


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_identical_tensors_have_no_diagnosis(dtype):
    t = torch.randn(5, 3, 8).to(dtype)
    t[0, 0, 0] = float("nan")
    assert diagnose(t, t.clone()) is None


def test_negative_zero_differs_from_zero():
    a, b = torch.zeros(4, 1, 1), torch.zeros(4, 1, 1)
    b[2, 0, 0] = -0.0
    d = diagnose(a, b)
    assert d.differing == 1 and d.first == (2, 0, 0) and d.max_abs == 0.0


def test_nan_against_a_number_is_an_infinite_distance():
    a, b = torch.ones(2, 2, 2), torch.ones(2, 2, 2)
    a[1, 1, 0] = float("nan")
    d = diagnose(a, b)
    assert d.differing == 1 and d.first == (1, 1, 0) and d.max_ulp == float("inf")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_diagnosis_counts_ulps_and_finds_the_first_mismatch(dtype):
    expected = torch.full((3, 2, 4), 1.5, dtype=dtype)
    actual = expected.clone()
    up = torch.nextafter(expected[1, 0, 3].float(), torch.tensor(2.0)).to(dtype)
    if up == expected[1, 0, 3]:  # nextafter in fp32 rounds back in a narrow dtype: step the raw bits instead
        up = (expected[1, 0, 3:4].view(torch.int16) + 1).view(dtype)[0]
    actual[1, 0, 3] = up
    actual[2, 1, 0] = -1.5
    d = diagnose(actual, expected)
    assert d.differing == 2
    assert d.first == (1, 0, 3)
    assert d.max_abs == 3.0
    assert d.max_ulp > 1  # the sign flip is far; the nudge alone would be 1
    assert d.actual_at_first == float(up)
    one = expected.clone()
    one[1, 0, 3] = up
    assert diagnose(one, expected).max_ulp == 1


def test_ulp_distance_across_zero_counts_both_sides():
    tiny = torch.tensor([1e-45])  # the smallest fp32 subnormal
    assert diagnose(tiny, -tiny).max_ulp == 2


def test_assertion_message_carries_the_diagnosis():
    a, b = torch.zeros(2, 2, 2), torch.zeros(2, 2, 2)
    b[1, 0, 1] = 0.25
    with pytest.raises(AssertionError, match=r"paged vs dense: not bit-identical: 1 of 8 elements differ.*\(1, 0, 1\)"):
        assert_bit_identical(a, b, "paged vs dense")


def test_shape_or_dtype_mismatch_is_an_error_not_a_diagnosis():
    with pytest.raises(ValueError, match=r"cannot compare \(2, 2\) torch.float32 with \(2, 3\)"):
        diagnose(torch.zeros(2, 2), torch.zeros(2, 3))


def test_the_same_view_has_no_view_mismatch():
    cache = torch.zeros(3, 2, 16, 4)
    assert view_mismatch(cache.unbind(1)[0], cache[:, 0]) == []


def test_a_copy_with_equal_values_is_another_view():
    # Same shape, strides and offset: only the memory tells the copy apart, as it would hide a wrong layout.
    k = torch.arange(2 * 16 * 4.0).reshape(2, 16, 4)
    copy = k.clone()
    assert torch.equal(copy, k)
    wrong = view_mismatch(copy, k)
    assert [w.split()[0] for w in wrong] == ["data_ptr", "storage"], wrong
    assert wrong[0] == f"data_ptr {copy.data_ptr()} (contract: {k.data_ptr()})"


def test_a_transposed_view_differs_in_strides_only():
    square = torch.zeros(4, 4)
    assert view_mismatch(square.t(), square) == ["stride (1, 4) (contract: (4, 1))"]


def test_the_stride_of_a_size_1_axis_is_ignored_and_an_offset_view_named():
    t = torch.zeros(3, 1, 5)
    other = t.as_strided((3, 1, 5), (5, 999, 1))
    assert other.stride() != t.stride() and view_mismatch(other, t) == []
    assert view_mismatch(t[:, :, 1:], t[:, :, :4]) == ["storage_offset 1 (contract: 0)",
                                                       f"data_ptr {t.data_ptr() + 4} (contract: {t.data_ptr()})"]
