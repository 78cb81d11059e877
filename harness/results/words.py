"""How the harness counts things in words: `1 release`, `2 geometries`, `3 fixes`, `1,548 lines`, `a, b, c, ... 2 more`.

Standard library only: the report (harness.report) runs without torch.
"""

from __future__ import annotations


def plural(noun: str) -> str:
    """The plural of an English noun: consonant + y -> ies, a sibilant ending -> es, else + s."""
    if noun.endswith("y") and noun[-2:-1] not in ("", "a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def count(n: int, noun: str) -> str:
    """`n` (with thousands separators) and `noun`, in the plural unless `n` is 1."""
    return f"{n:,} {noun if n == 1 else plural(noun)}"


def listed(names: list[str], shown: int = 3) -> str:
    """The first `shown` names, and how many more there are."""
    return ", ".join(names[:shown]) + (f", ... {len(names) - shown} more" if len(names) > shown else "")
