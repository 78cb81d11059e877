"""What a check returns (`Outcome`: a word of harness.results and what it rests on), and the bitwise comparison most
checks return (`compare`). Below both the runner (harness.run) and the check bodies, which import it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.compare import diagnose
from harness.device import costs
from harness.results import Word


@dataclass(frozen=True)
class Outcome:
    """A word of harness.results and what it rests on."""

    word: Word
    diagnosis: str = ""
    where: str = ""  # where in the example it was found (a layer and block), for its REPRO line

    def __post_init__(self) -> None:
        object.__setattr__(self, "word", Word(self.word))  # an unknown word is a ValueError here, not a result


def compare(actual: torch.Tensor, expected: torch.Tensor, what: str,
            axes: tuple[str, ...] = ("token", "head", "dim")) -> Outcome:
    """bit-identical, or differs with the harness.compare diagnosis (`axes` name the tensors' axes)."""
    with costs.phase("compare"):
        return _compared(actual, expected, what, axes)


def _compared(actual: torch.Tensor, expected: torch.Tensor, what: str, axes: tuple[str, ...]) -> Outcome:
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Outcome(Word.DIFFERS, f"{what}: {tuple(actual.shape)} {actual.dtype} vs "
                                     f"{tuple(expected.shape)} {expected.dtype}")
    d = diagnose(actual, expected, axes)
    return Outcome(Word.BIT_IDENTICAL) if d is None else Outcome(Word.DIFFERS, f"{what}: not bit-identical: {d}")
