"""Bitwise comparison of outputs, a diagnosis of how two tensors differ, and whether two tensors are one view.

Equal means equal bits: NaN equals NaN of the same payload, -0.0 differs from 0.0. The same view means the same
shape, strides, storage offset, data pointer, storage and dtype, strides compared only where the size is not 1 (an
axis of size 1 addresses nothing, so torch leaves its stride free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64, torch.float8_e4m3fn: torch.int8, torch.float8_e5m2: torch.int8,
           torch.uint8: torch.int8}  # the byte types: fp8 and NVFP4 caches


@dataclass(frozen=True)
class Diagnosis:
    """How `actual` differs from `expected`; `first` indexes the first differing element along `axes`."""

    differing: int
    total: int
    max_ulp: float
    max_abs: float
    first: tuple[int, ...]
    actual_at_first: float
    expected_at_first: float
    axes: tuple[str, ...] = ("token", "head", "dim")

    def __str__(self) -> str:
        return (
            f"{self.differing} of {self.total} elements differ; max ULP distance {self.max_ulp:g}, "
            f"max abs diff {self.max_abs:g}; first mismatch at ({', '.join(self.axes)}) = {self.first}: "
            f"{self.actual_at_first!r} vs expected {self.expected_at_first!r}"
        )


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor as a same-width signed integer tensor."""
    if t.dtype not in _INT_OF:
        raise TypeError(f"bitwise comparison supports {sorted(map(str, _INT_OF))}, got {t.dtype}")
    return t.contiguous().view(_INT_OF[t.dtype])


def diagnose(actual: torch.Tensor, expected: torch.Tensor, axes: tuple[str, ...] = ("token", "head", "dim")
             ) -> Diagnosis | None:
    """None when the two are bit-identical, else what differs (`axes` name the tensors' axes)."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise ValueError(
            f"cannot compare {tuple(actual.shape)} {actual.dtype} with {tuple(expected.shape)} {expected.dtype}"
        )
    # On the tensors' device: the common case (equal) moves one scalar to the host, not two outputs.
    a, e = bits(actual), bits(expected)
    if torch.equal(a, e):
        return None
    a, e = a.cpu(), e.cpu()
    differ = a != e
    count = int(differ.sum())
    first = tuple(int(i) for i in differ.nonzero()[0])
    ulp = (_ordered(a) - _ordered(e)).abs().double()
    af, ef = actual.detach().cpu().double(), expected.detach().cpu().double()
    nan_mismatch = differ & (af.isnan() | ef.isnan())
    ulp[nan_mismatch] = float("inf")
    absdiff = (af - ef).abs()
    absdiff[nan_mismatch] = float("inf")
    return Diagnosis(
        differing=count,
        total=a.numel(),
        max_ulp=float(ulp[differ].max()),
        max_abs=float(absdiff[differ].max()),
        first=first,
        actual_at_first=float(af[first]),
        expected_at_first=float(ef[first]),
        axes=axes,
    )


def assert_bit_identical(actual: torch.Tensor, expected: torch.Tensor, context: str = "") -> None:
    """Raise AssertionError carrying the diagnosis unless the two are bit-identical."""
    diagnosis = diagnose(actual, expected)
    if diagnosis is not None:
        raise AssertionError(f"{context}{': ' if context else ''}not bit-identical: {diagnosis}")


def view_mismatch(got: torch.Tensor, want: torch.Tensor) -> list[str]:
    """The fields in which `got` is not the view `want` is, each "name got (contract: want)"; empty when it is."""
    fields = {"shape": (tuple(got.shape), tuple(want.shape)), "stride": (_addressing(got), _addressing(want)),
              "storage_offset": (got.storage_offset(), want.storage_offset()),
              "data_ptr": (got.data_ptr(), want.data_ptr()),
              "storage": (got.untyped_storage().data_ptr(), want.untyped_storage().data_ptr()),
              "dtype": (got.dtype, want.dtype)}
    return [f"{name} {g} (contract: {w})" for name, (g, w) in fields.items() if g != w]


def _addressing(t: torch.Tensor) -> tuple[int | None, ...]:
    return tuple(None if n == 1 else st for n, st in zip(t.shape, t.stride()))


def _ordered(b: torch.Tensor) -> torch.Tensor:
    # Map sign-magnitude float bits onto integers ordered like the floats, so a difference counts ULPs.
    wide = b.to(torch.int64)
    magnitude = wide & ((1 << (8 * b.element_size() - 1)) - 1)
    return torch.where(wide < 0, -magnitude, wide)
