"""A planted performance bug: the built-in kernel behind a subject that copies the K/V views it is handed into
contiguous tensors before every paged launch (what a kernel that cannot read strided pages would do). Its outputs
are the built-in's, bit for bit, so every conformance check passes; only the performance lane
(harness.performance) can tell it from the built-in: its paged time carries two whole-cache copies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.draws.cases import Case
from harness.handed.cache import Paging
from harness.subjects import TileConfig, builtin


class ContiguousViews(builtin.BuiltinSubject):
    """The built-in kernel, paged over contiguous copies of its K/V views."""

    name = "contiguous-views"

    def paged_launch(
        self, case: Case, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging,
        tile: TileConfig | None,
    ) -> Callable[[], torch.Tensor]:
        super().paged_launch(case, q, k_cache, v_cache, paging, tile)  # refuses what the built-in refuses
        table, tile = paging.block_table.to(q.device), tile or self.tile_config(case)
        batch = builtin.batch_tensors(case, q.device)

        def copied() -> torch.Tensor:
            k, v = (t.clone(memory_format=torch.contiguous_format) for t in (k_cache, v_cache))
            return builtin.launch(case, q, k, v, table, tile, batch)

        return copied
