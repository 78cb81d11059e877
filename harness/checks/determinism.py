"""determinism: the same inputs through the paged forward twice give the same bits."""

from __future__ import annotations

from harness import checks
from harness.checks.bit_identity import Placed
from harness.checks.outcome import Outcome, compare
from harness.run.trial import Trial


class Determinism(Placed):
    def body(self, t: Trial) -> Outcome:
        case, p = t.example.case, t.prepare()
        keys, values = t.split(p)
        tile = t.call(t.subject.tile_config, case)
        first = t.call(t.subject.paged_forward, case, p.q, keys, values, p.paging, tile)
        second = t.call(t.subject.paged_forward, case, p.q, keys, values, p.paging, tile)
        return compare(second, first, f"second paged run vs first, tile {tile}")


IMPLEMENTATION = Determinism(checks.DETERMINISM)
