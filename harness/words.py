"""Counted nouns in kvconform's sentences (standard library only: the report uses it)."""


def count(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless n is 1 ("1 geometry", "2 geometries", "3 releases")."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun[:-1] + 'ies' if noun.endswith('y') and noun[-2:-1] not in 'aeiou' else noun + 's'}"
