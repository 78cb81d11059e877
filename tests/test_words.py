"""Counted nouns read as English: the plural only where the count is not 1, thousands separated."""

import pytest

from harness.results.words import count, plural


@pytest.mark.parametrize(("noun", "nouns"), [
    ("release", "releases"), ("new finding", "new findings"), ("cache dtype", "cache dtypes"),
    ("geometry", "geometries"), ("key", "keys"), ("day", "days"), ("fix", "fixes"), ("pass", "passes"),
    ("batch", "batches"), ("y", "ys"),
])
def test_plural(noun, nouns):
    assert plural(noun) == nouns


def test_count_says_the_singular_only_for_one():
    assert [count(n, "geometry") for n in (0, 1, 2)] == ["0 geometries", "1 geometry", "2 geometries"]
    assert count(1548, "line") == "1,548 lines" and count(1, "fix") == "1 fix"
