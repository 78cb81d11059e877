"""Subjects: the implementations under test. The harness never fixes a subject's bug for it; it reports.

A subject meets a release's caches as it would inside vLLM: each call hands it a layer's kv_cache and the layer
(harness.handed.layer.Layer: the release, its attention backend class — vLLM's own live, the recorded stand-in in
replay — the kv_cache_dtype string, block size, KV heads, head sizes, the layout setting in force, and for cross-layer
allocations the layer count and index), never kvconform's contract: it decides the layout by asking the backend as
it would in vLLM (`layer.backend.get_kv_cache_shape(...)`, `get_kv_cache_stride_order(...)`, the KVCacheLayout
named by `layer.kv_cache_layout`; `import vllm...` works in replay too while it is called), and the checks judge
what it took against the contract the release was probed to hand out.

A subject brings its own K/V split of a release's kv_cache, a paged forward over canonical K/V views
[B, N, H, D] (any strides, innermost stride 1) and a dense forward over contiguous token rows [total_kv, H, D].
Both forwards take q [total_q, num_heads, D] and return the output in the same shape; sequence boundaries come
from the case. Bit-identity between the two is only meaningful with a pinned tile config for both calls; unpinned
(`tile` None, each call tuned for itself) they agree within a rounding bound (harness.checks.ulp_autotuned).
A subject declares its sparsity semantics (`SparsitySemantics`) where subjects legitimately differ; the oracle
(harness.compare.reference) judges each subject by its own. A kernel may also offer `paged_launch` and `dense_launch`:
the forward's checks done once, returning a call that only launches, which the performance lane (harness.performance)
times; without them it times the whole forward, host-side checks and their device waits included.

Not every subject is a kernel. A subject declares what it can do in `capabilities` (`CAPABILITIES`):
  split     it takes a layer's kv_cache apart into K and V views (every KV-cache consumer: an RL framework reading
            the cache, a cache manager)
  transfer  it extracts the K/V of some blocks through its own views and injects them into another cache of the same
            contract (offloaders, connectors): `extract`, `inject`
  connector it is driven as vLLM drives a KV connector over a whole model (harness.handed.model): built once per
            side with the model's KV cache config and its attention layers' values, `connector(kv_cache_config,
            layers)`, and on what that returns: `register_kv_caches` once with every tensor the release registers,
            then `save` on the source side and `load` on the target side of manager block ids, one tensor per KV
            cache group (`Connector`). Live, the config is the installed release's own KVCacheConfig; in a replay
            the recorded stand-in (harness.handed.model.CacheConfig). A connector that needs vLLM's own classes
            (a real one: vLLM's connector base, isinstance on spec classes) says why in `needs_vllm`; its replayed
            examples are then not-run, never passes
  forward   it runs attention over paged and dense K/V (kernels): `tile_config`, `paged_forward`, `dense_forward`
  autotune  its forwards, handed `tile` None, pick their tile config per call among `autotune_configs(case)` (an
            autotuner that can time them here): the ulp-autotuned check
A subject without the attribute is a kernel: split + forward. Each check's declaration (harness.checks, its
`needs`) says what it needs; its items are generated only for subjects that declare all of it, the others get one
not-applicable line per release. `supports` is optional outside kernels.

K/V views come in the cache's view type (fp8 for fp8 caches, bytes for NVFP4) and width (the head size plus an
inline scale for per-token-head caches). A subject that cannot read some caches says so in the optional
`supports_layer(layer)` (a reason, or None): those examples are `unsupported`, never passes, and the run's first
lines say what the subject is not checked on. A consumer (no `forward`) without it meets every cache; a kernel
without it is taken to read model-dtype caches only. A subject that only ever meets some backends' caches (a plugin
of one backend) names them in an optional `backends` tuple; the other backends' geometries are then not its
targets.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.draws.cases import Case
from harness.handed.cache import Paging
from harness.handed.layer import Layer
from harness.handed.model import CacheConfig


@dataclass(frozen=True)
class TileConfig:
    """Compile-time tiling of a Triton attention kernel: query rows and keys per tile, warps, stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 1


SKIP_DECISIONS = ("row", "query_tile")
RECENT_WINDOWS = ("to_kv_end", "to_query")


@dataclass(frozen=True)
class SparsitySemantics:
    """The sparsity rules a subject follows where subjects legitimately differ (harness.compare.reference states them
    all). The defaults are the built-in subject's.

    skip_decision: who keeps or drops a key tile in skip-softmax mode: each query row for itself ("row"), or the
      valid rows of one head's block_m consecutive queries of a sequence together ("query_tile": dropped only if
      every one of them may drop it, otherwise kept for all of them).
    nm_dense_decode_rows: in N:M mode every row of a q_len == 1 sequence keeps all its keys.
    recent_window: the N:M dense window of a query at q_pos: keys > q_pos - recent ("to_kv_end", so also keys after
      the query when not causal) or keys in (q_pos - recent, q_pos] ("to_query").
    nm_tied_kept: N:M group sizes m for which every key tied with the n-th highest score is kept too (for other m,
      ties go to the lower key index: exactly n kept).
    """

    skip_decision: str = "row"
    nm_dense_decode_rows: bool = False
    recent_window: str = "to_kv_end"
    nm_tied_kept: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.skip_decision not in SKIP_DECISIONS:
            raise ValueError(f"unknown skip_decision {self.skip_decision!r}; known: {SKIP_DECISIONS}")
        if self.recent_window not in RECENT_WINDOWS:
            raise ValueError(f"unknown recent_window {self.recent_window!r}; known: {RECENT_WINDOWS}")


SPLIT, TRANSFER, CONNECTOR, FORWARD, AUTOTUNE = "split", "transfer", "connector", "forward", "autotune"
CAPABILITIES = (SPLIT, TRANSFER, CONNECTOR, FORWARD, AUTOTUNE)
DEFAULT_CAPABILITIES = frozenset({SPLIT, FORWARD})  # a subject that declares nothing: a kernel
METHODS = {SPLIT: ("split",), TRANSFER: ("extract", "inject"), CONNECTOR: ("connector",),
           FORWARD: ("tile_config", "paged_forward", "dense_forward"), AUTOTUNE: ("autotune_configs",)}


class Subject(Protocol):
    name: str
    capabilities: frozenset[str]  # optional: DEFAULT_CAPABILITIES when absent
    sparsity_semantics: SparsitySemantics
    needs_vllm: str  # optional (connector): why it runs only where the release is installed

    def supports(self, case: Case) -> str | None:
        """None when the subject can run `case`, else the reason it cannot."""

    def supports_layer(self, layer: Layer) -> str | None:
        """(optional) None when the subject reads caches of `layer`, else the reason it cannot."""

    def split(self, kv_cache: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        """The subject's own K and V views [B, N, H, D] of `layer`'s kv_cache."""

    def tile_config(self, case: Case) -> TileConfig:
        """The tile config pinned for both calls of the bit-identity lane."""

    def paged_forward(
        self, case: Case, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging,
        tile: TileConfig | None,
    ) -> torch.Tensor:
        """Attention over paged K/V; `tile` None lets the subject autotune."""

    def dense_forward(
        self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | None
    ) -> torch.Tensor:
        """The same attention over contiguous K/V token rows."""

    def paged_launch(
        self, case: Case, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging,
        tile: TileConfig | None,
    ) -> Callable[[], torch.Tensor]:
        """(optional) paged_forward's checks, done now; the returned call runs only its launches."""

    def dense_launch(
        self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | None
    ) -> Callable[[], torch.Tensor]:
        """(optional) dense_forward's checks, done now; the returned call runs only its launches."""

    def autotune_configs(self, case: Case) -> tuple[TileConfig, ...]:
        """(autotune) The tile configs a forward handed `tile` None chooses among for `case`."""

    def extract(self, kv_cache: torch.Tensor, layer: Layer, block_ids: torch.Tensor) -> object:
        """(transfer) The K and V of blocks `block_ids` (int64, on kv_cache's device) of `layer`'s kv_cache, read
        through the subject's own views, as a payload of the subject's choosing. The payload must own its data: the
        blocks are reused (overwritten) as soon as extract returns."""

    def inject(self, kv_cache: torch.Tensor, layer: Layer, block_ids: torch.Tensor, payload: object) -> None:
        """(transfer) Write `payload` (extract's, same length) into blocks `block_ids` of another layer's kv_cache of
        the same layout, in place, touching nothing else."""

    def connector(self, kv_cache_config: CacheConfig, layers: dict[str, Layer]) -> Connector:
        """(connector) A new connector of one side of a transfer, as vLLM builds one: the model's KV cache config
        (its groups' layer names and specs, its tensors: vLLM's own KVCacheConfig live, the stand-in in a replay)
        and the values of its attention layers holding K and V by name."""


class Connector(Protocol):
    """What a subject's `connector` returns: one side of a transfer, as vLLM's worker drives it."""

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor | list[torch.Tensor]]) -> None:
        """Every tensor the release registers, by layer name: K/V caches, a Mamba layer's states (a tensor, or a
        list of them up to vLLM 0.26), latent and indexer caches. Called once; the connector may re-point their
        storage (the caller reads and writes through these tensors afterwards, never through others)."""

    def save(self, block_ids: tuple[torch.Tensor, ...]) -> object:
        """(source) The blocks of each KV cache group's manager block ids (int64, one tensor per group in the
        config's order: the scheduler's ids, each holding `manager_block_size // block_size` blocks of a K/V layer's
        view) of every registered tensor of the group, as a payload that owns its data: the blocks are reused as
        soon as save returns."""

    def load(self, block_ids: tuple[torch.Tensor, ...], payload: object) -> None:
        """(target) Write `payload` (save's, same lengths per group) into these manager blocks of the registered
        tensors, in place, touching nothing else."""


class Launched:
    """A kernel whose forwards are its `paged_launch` and `dense_launch` called at once, so that the performance lane
    times exactly the launches the checks run."""

    def paged_forward(
        self, case: Case, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging,
        tile: TileConfig | None,
    ) -> torch.Tensor:
        return self.paged_launch(case, q, k_cache, v_cache, paging, tile)()

    def dense_forward(
        self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | None
    ) -> torch.Tensor:
        return self.dense_launch(case, q, k, v, tile)()


def check_paged_views(case: Case, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Raise ValueError unless K and V are canonical [num_blocks, block_size, kv_heads, head_dim] views for `case`."""
    want = (case.block_size, case.kv_heads, case.head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4 or tuple(t.shape[1:]) != want:
            raise ValueError(
                f"{name} shape {tuple(t.shape)} strides {tuple(t.stride())} is not a [num_blocks, block_size, "
                f"kv_heads, head_dim] view with [block_size, kv_heads, head_dim] = {list(want)}"
            )


def capabilities_of(subject: object) -> frozenset[str]:
    """What the subject declares it can do (DEFAULT_CAPABILITIES when it declares nothing). ValueError for an unknown
    capability or a declared one whose methods the subject lacks."""
    declared = getattr(subject, "capabilities", None)
    caps = DEFAULT_CAPABILITIES if declared is None else frozenset(declared)
    unknown = sorted(caps - set(CAPABILITIES))
    if unknown or not caps:
        raise ValueError(f"subject {getattr(subject, 'name', type(subject).__name__)!r}: capabilities "
                         f"{sorted(caps)}: {'unknown ' + ', '.join(unknown) if unknown else 'none declared'}; "
                         f"known: {', '.join(CAPABILITIES)}")
    missing = [f"{c} needs {m}" for c in sorted(caps) for m in METHODS[c] if not callable(getattr(subject, m, None))]
    if missing:
        raise ValueError(f"subject {getattr(subject, 'name', type(subject).__name__)!r} declares "
                         f"{', '.join(sorted(caps))} but lacks methods: {'; '.join(missing)}")
    return caps


def semantics_of(subject: Subject) -> SparsitySemantics:
    """The subject's declared sparsity semantics; a subject that declares none is judged by the default."""
    return getattr(subject, "sparsity_semantics", SparsitySemantics())


BUILTIN = "builtin"  # the one subject the core names: harness.subjects.builtin's kernel


def load_subject(name: str) -> Subject:
    """The built-in subject (`builtin`) or the class at `module:Class`, imported only when asked for."""
    if name != BUILTIN and ":" not in name:
        raise ValueError(f"unknown subject {name!r}; a subject is {BUILTIN} or module:Class")
    module, _, cls = ("harness.subjects.builtin:BuiltinSubject" if name == BUILTIN else name).partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `module:Class` names a module of the current directory, as `python -m` finds it
    try:
        found = getattr(importlib.import_module(module), cls, None)
    except ImportError as e:
        raise ValueError(f"subject {name!r}: cannot import module {module!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the subject's own module raised while it was imported
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise ValueError(f"subject {name!r}: importing module {module!r} raised {type(e).__name__}: {e} "
                         f"({where.filename}:{where.lineno})") from None
    if not isinstance(found, type):
        raise ValueError(f"subject {name!r}: {module}.{cls} is {'missing' if found is None else 'not a class'}; "
                         "a subject is named module:Class")
    return found()
