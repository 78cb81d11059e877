"""The `modelopt` subject: nvidia-modelopt's Triton flash-attention kernel and its vLLM plugin's own K/V split.

What runs is modelopt's code, unchanged (facts per release in docs/modelopt.md):
- forwards: `modelopt/torch/kernels/common/attention/triton_fa.py::attention` (the function the plugin imports as
  `triton_attention`), paged (k_cache/v_cache [num_blocks, page, H, D] views + block_table + page_size, as the
  plugin calls it) or dense (contiguous [total_kv, H, D] token rows). One kernel, `_attn_fwd`, serves both;
  `IS_PAGED` is a constexpr that only changes how K and V tiles are loaded.
- tile: `_attn_fwd` is a `triton.autotune` over `_FWD_CONFIGS`; `attention()` takes no tile. A pinned call gives the
  autotuner exactly one candidate (as modelopt pins itself under pytest). `tile=None` gives it modelopt's own: on
  CUDA all of `_FWD_CONFIGS` (the subject declares `autotune` there); in Triton's interpreter the list as it stands.
- split: `plugins/vllm.py::ModelOptSparseAttentionImpl.forward` detects the layout (0.46+:
  `_flash_attention_kv_cache_layout()`, probing `FlashAttentionBackend.get_kv_cache_shape(3, 16, 1, 16)`; 0.45:
  always `kv_cache.unbind(0)`), splits, and hands `k_cache`/`v_cache` to `triton_attention`; on a FlashInfer layer
  (0.46+) `_flashinfer_forward` refuses any kv_cache but a 5-axis one with 2 at axis 1 (ValueError) and takes
  `kv_cache[:, 0]`, `kv_cache[:, 1]`. `split()` runs that forward and takes the views it hands over, stopping
  before any launch.
- refusals: only modelopt's own, each citing the line that makes it (`REFUSALS`, `HEAD_DIMS`, `NM_GROUPS`,
  `backends`). 0.46+ installs its impls through `plugins/vllm_runtime.py`, which validates every layer before it
  swaps any and raises NotImplementedError naming each refused one; 0.45 has no installer and refuses no layer.
- replay: without vLLM installed, the plugin is imported, and each split runs, under the recorded release's stand-in
  vLLM modules (harness.vllm_api.replaying), bound with `for_release` or the layer's; each split rebinds the names
  the plugin bound at import (under the newest recorded release) to the replayed release's.

Sparsity maps to `attention()` keywords (skip_softmax_threshold; sparsity_n/m, dense_sink_tokens, dense_recent_tokens)
and `sparsity_semantics` states modelopt's own rules, read from triton_fa.py and skip_softmax_helpers.py
(docs/modelopt.md has both, with the reasons; the oracle judges the subject by them).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

import torch
from packaging.version import Version

from harness import vllm_api
from harness.compare import view_mismatch
from harness.contract import ContractError, views
from harness.draws.cases import Case
from harness.handed.cache import Paging
from harness.handed.layer import Layer, contract_of
from harness.recordings import store
from harness.recordings.store import Recording
from harness.subjects import AUTOTUNE, FORWARD, SPLIT, Launched, SparsitySemantics, TileConfig, check_paged_views

ENV = "KVCONFORM_MODELOPT"  # a PyPI version ("0.47.0") or a modelopt source tree (a directory holding `modelopt/`)
PLUGIN = "modelopt.torch.sparsity.attention_sparsity.plugins.vllm"
NM_GROUPS = (4, 8)  # kernels/sparsity/attention/skip_softmax_helpers.py:99 static_assert SPARSITY_M == 4 or 8
HEAD_DIMS = (16, 256)  # triton_fa.py:394 tl.dot over next_pow2(head_dim): none of K < 16; vLLM's take <= 256
FLASHINFER = "_flashinfer_forward"  # plugins/vllm.py (0.46+): the FlashInfer adapter's forward, module-level
RUNTIME = "modelopt.torch.sparsity.attention_sparsity.plugins.vllm_runtime"  # 0.46+: the installers


@dataclass(frozen=True)
class Refusal:
    """A layer modelopt's installer refuses: where (file:line of the 0.46-0.47 wheel) and its own words."""

    where: str
    says: str
    refuses: Callable[[Layer], bool]

    def reason(self, layer: Layer) -> str:
        return f"modelopt refuses this layer ({self.where}: {self.says.format(layer=layer)})"


REFUSALS = (  # vllm_runtime._plan_vllm_attention: _require_supported_vllm, then _layer_errors per layer
    Refusal("plugins/vllm_runtime.py:145", "RuntimeError: ModelOpt vLLM attention transforms require vLLM >= 0.15.0",
            lambda layer: layer.release != "main" and Version(layer.release) < Version("0.15.0")),
    Refusal("plugins/vllm_runtime.py:217", "head_size={layer.head_size} must be a multiple of 16",
            lambda layer: layer.head_size % 16 != 0),
    Refusal("plugins/vllm_runtime.py:220", "head_size_v={layer.head_size_v} must equal head_size={layer.head_size}",
            lambda layer: layer.head_size_v != layer.head_size),
    Refusal("plugins/vllm_runtime.py:226", "FP8 KV cache is unsupported ({layer.cache_dtype})",
            lambda layer: layer.cache_dtype.startswith("fp8")),
)
PINNED = TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)  # in every release's _FWD_CONFIGS (0.45-0.47)

_lock = threading.RLock()  # the autotuner's candidates, the plugin's backend and torch.cuda.device are process-wide


class ModeloptUnavailable(RuntimeError):
    """nvidia-modelopt (or the version asked for, or its vLLM plugin) is not importable here."""


@dataclass(frozen=True)
class VllmRelease:
    """A recorded release to replay: its name and recording (whose layout API the stand-ins are built from)."""

    version: str
    recording: Recording = field(compare=False, repr=False)

    @classmethod
    def from_recording(cls, recording: Recording) -> VllmRelease:
        """The release as its probe recorded it; ContractError when the recording holds no layout API."""
        try:
            vllm_api.api_of(recording)
        except vllm_api.ApiError as e:
            raise ContractError(str(e)) from None
        return cls(recording.release, recording)

    @property
    def backend_methods(self) -> frozenset[str]:
        """The layout members the release's FlashAttentionBackend has (as recorded)."""
        return frozenset(vllm_api.api_of(self.recording).backend("FLASH_ATTN").members)


@dataclass(frozen=True)
class _Modelopt:
    version: str
    plugin: types.ModuleType
    kernel: types.ModuleType  # the module of the plugin's `triton_attention`
    live: bool  # vLLM is installed: the plugin queries the real FlashAttentionBackend
    installer: bool  # vllm_runtime (0.46+) validates each layer before installing (REFUSALS)


class ModeloptSubject(Launched):
    """nvidia-modelopt's kernel and vLLM plugin (see the module docstring). In replay the split needs the recorded
    release: bound here (`for_release`), or else the layer's."""

    name = "modelopt"
    sparsity_semantics = SparsitySemantics(skip_decision="query_tile", nm_dense_decode_rows=True,
                                           recent_window="to_query", nm_tied_kept=(8,))

    def __init__(self, release: VllmRelease | None = None) -> None:
        self.release = release
        self.last_tile: TileConfig | None = None  # the config the kernel's last launch ran with

    def for_release(self, release: VllmRelease) -> ModeloptSubject:
        """This subject replaying `release` (its recorded FlashAttentionBackend) when vLLM is not installed."""
        return ModeloptSubject(release)

    @property
    def version(self) -> str:
        """The nvidia-modelopt under test, e.g. `0.47.0` or `0.47.0 (tree /src/Model-Optimizer)`."""
        return _load().version

    @property
    def live(self) -> bool:
        """vLLM is installed, so the plugin queries the real FlashAttentionBackend (no replay)."""
        return _load().live

    def supports(self, case: Case) -> str | None:
        if not HEAD_DIMS[0] <= case.head_dim <= HEAD_DIMS[1]:
            return f"head_dim {case.head_dim} not supported; modelopt's kernel needs {HEAD_DIMS[0]}..{HEAD_DIMS[1]}"
        sp = case.sparsity
        if sp.mode == "nm" and sp.m not in NM_GROUPS:
            return f"nm group size m={sp.m} not supported; modelopt supports m in {NM_GROUPS}"
        return None

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends whose impl modelopt replaces. 0.46+: vllm_runtime.py:293 refuses any impl but a
        FlashAttentionImpl (FLASH_ATTN_DIFFKV's subclasses it) or a FlashInferImpl. 0.45: plugins/vllm.py:22, "Only
        impl is swapped from FlashAttentionImpl"."""
        if _load().installer:
            return ("FLASH_ATTN", "FLASH_ATTN_DIFFKV", "FLASHINFER")
        return ("FLASH_ATTN",)

    def supports_layer(self, layer: Layer) -> str | None:
        if not _load().installer:
            return None
        return next((r.reason(layer) for r in REFUSALS if r.refuses(layer)), None)

    @property
    def capabilities(self) -> frozenset[str]:
        """A kernel's, and autotune where modelopt's autotuner can time its candidates (CUDA)."""
        return frozenset({SPLIT, FORWARD} | ({AUTOTUNE} if _autotunes() else set()))

    def tile_config(self, case: Case) -> TileConfig:
        return PINNED

    def autotune_configs(self, case: Case) -> tuple[TileConfig, ...]:
        return tuple(TileConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
                     for c in _candidates(_load().kernel))

    def split(self, kv_cache: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        views.validate(contract_of(layer), kv_cache)  # the adapter's guard: the plugin itself checks nothing
        mo = _load()
        release = self.release or (None if mo.live else _recorded_release(layer))
        where = (
            f"modelopt {mo.version} vLLM plugin ({'live vLLM' if mo.live else _replaying(release)}) on kv_cache "
            f"shape {tuple(kv_cache.shape)} strides {tuple(kv_cache.stride())}, {layer.describe()}"
        )
        with _lock, _backend(mo, layer, release):
            try:
                got = _plugin_kv_views(mo.plugin, kv_cache, layer)
            except Exception as err:  # whatever the plugin raises is the finding; its text is kept verbatim
                raise ContractError(f"{where}: {type(err).__name__}: {err}") from err
        if got is None:
            raise ContractError(f"{where}: the plugin's forward never handed K/V to its Triton kernel")
        return got

    def paged_launch(
        self, case: Case, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, paging: Paging,
        tile: TileConfig | None,
    ) -> Callable[[], torch.Tensor]:
        self._check(case, tile, q, k=k_cache, v=v_cache)
        check_paged_views(case, k_cache, v_cache)
        table = paging.block_table.to(device=q.device, dtype=torch.int32).contiguous()
        if (paging.kv_lens, paging.block_size, table.shape[0]) != (case.kv_lens, case.block_size, len(case.kv_lens)):
            raise ValueError(
                f"paging (kv_lens {paging.kv_lens}, block_size {paging.block_size}, table {tuple(table.shape)}) "
                f"does not match the case's kv_lens {case.kv_lens} block_size {case.block_size}"
            )
        # modelopt's kernel loads whatever page the table names: check every page a sequence uses is in the cache.
        host = paging.host_block_table()
        for seq, kv in enumerate(case.kv_lens):
            pages = host[seq, : -(-kv // case.block_size)]
            if pages.numel() < -(-kv // case.block_size) or pages.min() < 0 or pages.max() >= k_cache.shape[0]:
                raise ValueError(
                    f"block table {tuple(host.shape)} row {seq} (kv_len {kv}) holds pages {pages.tolist()}, not "
                    f"enough pages inside the cache's [0, {k_cache.shape[0]})"
                )
        b_start, b_len, _, kv_len = _varlen(case, q.device)
        # As the plugin calls it: dummy K/V whose shape[1] gives the GQA ratio, page_size = key_cache.shape[1].
        dummy = torch.empty(0, case.kv_heads, case.head_dim, device=q.device, dtype=q.dtype)
        return lambda: self._launch(
            q, tile, dummy, dummy, b_start, b_len, max(case.q_lens), case.causal, case.scale, None, kv_len,
            max(case.kv_lens), k_cache=k_cache, v_cache=v_cache, block_table=table, page_size=k_cache.shape[1],
            **_sparse_kw(case),
        )

    def dense_launch(
        self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: TileConfig | None
    ) -> Callable[[], torch.Tensor]:
        self._check(case, tile, q, k=k, v=v)
        for name, t in (("k", k), ("v", v)):
            want = (sum(case.kv_lens), case.kv_heads, case.head_dim)
            if tuple(t.shape) != want:
                raise ValueError(f"{name} shape {tuple(t.shape)} is not [total_kv, kv_heads, head_dim] = {list(want)}")
        b_start, b_len, kv_start, kv_len = _varlen(case, q.device)
        return lambda: self._launch(
            q, tile, k, v, b_start, b_len, max(case.q_lens), case.causal, case.scale, kv_start, kv_len,
            max(case.kv_lens), **_sparse_kw(case),
        )

    def _launch(self, q: torch.Tensor, tile: TileConfig | None, *args, **kwargs) -> torch.Tensor:
        mo = _load()
        with _lock, _tiles(mo.kernel, tile), _launch_device(q.device):
            out = mo.kernel.attention(q, *args, **kwargs)
            best = mo.kernel._attn_fwd.best_config
        self.last_tile = TileConfig(best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], best.num_warps, best.num_stages)
        if tile is not None and self.last_tile != tile:
            raise RuntimeError(f"modelopt's autotuner ran {self.last_tile} although {tile} was pinned")
        return out

    def _check(self, case: Case, tile: TileConfig | None, q: torch.Tensor, **kv: torch.Tensor) -> None:
        shapes = ", ".join(f"{n} {tuple(t.shape)} {t.dtype}" for n, t in {"q": q, **kv}.items())
        reason = self.supports(case)
        if reason:
            raise ValueError(f"modelopt subject cannot run this case: {reason} ({shapes})")
        if any(t.dtype != case.torch_dtype for t in (q, *kv.values())):
            raise ValueError(f"q/k/v dtypes differ from the case's {case.dtype}: {shapes}")
        if any(t.device != q.device for t in kv.values()):
            raise ValueError(f"q, k, v are on different devices: {shapes}")
        if tuple(q.shape) != (sum(case.q_lens), case.num_heads, case.head_dim):
            raise ValueError(f"q is not [total_q, num_heads, head_dim] = "
                             f"{[sum(case.q_lens), case.num_heads, case.head_dim]}: {shapes}")
        for name, t in {"q": q, **kv}.items():
            # The kernel adds the head-dim offset without a stride (`+ dim_pos`).
            if t.stride(-1) != 1:
                raise ValueError(f"{name} head_dim stride is {t.stride(-1)}, modelopt's kernel needs 1: shape "
                                 f"{tuple(t.shape)} strides {tuple(t.stride())}")
        sp = case.sparsity
        if tile is not None and sp.mode == "nm" and tile.block_n % sp.m:
            raise ValueError(f"tile {tile}: block_n must be a multiple of the nm group size m={sp.m}")


def split_mismatch(
    got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]
) -> str | None:
    """None when the plugin's K and V are exactly the contract's views (harness.compare.view_mismatch)."""
    for name, g, w in (("K", got[0], want[0]), ("V", got[1], want[1])):
        wrong = view_mismatch(g, w)
        if wrong:
            return (f"{name}: plugin view shape {tuple(g.shape)} strides {tuple(g.stride())} storage offset "
                    f"{g.storage_offset()}: {'; '.join(wrong)}")
    return None


def _replaying(release: VllmRelease | None) -> str:
    if release is None:
        return "replay, no recorded release"
    methods = sorted(m for m in release.backend_methods if m.startswith("get_kv_cache"))
    return f"REPLAY of vLLM {release.version}, FlashAttentionBackend stand-in with {methods or 'no get_kv_cache_*'}"


def _recorded_release(layer: Layer) -> VllmRelease:
    """The recorded release a replayed layer belongs to."""
    return VllmRelease.from_recording(layer.recording) if layer.recording else _recording(layer.release)


@functools.cache
def _recording(version: str) -> VllmRelease:
    return VllmRelease.from_recording(store.load(version))


def _sparse_kw(case: Case) -> dict:
    sp = case.sparsity
    if sp.mode == "skip_softmax":
        return {"skip_softmax_threshold": sp.threshold}
    if sp.mode == "nm":
        # Always explicit: modelopt's own default for dense_recent_tokens is 64, the harness's is 0.
        return {"sparsity_n": sp.n, "sparsity_m": sp.m, "dense_sink_tokens": sp.sink, "dense_recent_tokens": sp.recent}
    return {}


def _varlen(case: Case, device: torch.device) -> tuple[torch.Tensor, ...]:
    """b_start_loc, b_seq_len for queries and for keys, int32 like vLLM's query_start_loc and seq_lens."""

    def starts_lens(lens: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        n = torch.tensor(lens, dtype=torch.int32)
        return (n.cumsum(0) - n).to(torch.int32).to(device), n.to(device)

    return (*starts_lens(case.q_lens), *starts_lens(case.kv_lens))


def _autotunes() -> bool:
    """modelopt's autotuner can time its candidates here: a CUDA device, outside Triton's interpreter."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def _candidates(kernel: types.ModuleType) -> list:
    """What modelopt's autotuner chooses among in production: all of `_FWD_CONFIGS` (0.46+) where it can time them,
    although under pytest the kernel keeps the first alone; else the tuner's list as it stands."""
    full = getattr(kernel, "_FWD_CONFIGS", None)
    return list(full) if full and _autotunes() else list(kernel._attn_fwd.configs)


@contextlib.contextmanager
def _tiles(kernel: types.ModuleType, tile: TileConfig | None):
    """Give modelopt's autotuner exactly the pinned candidate for one call (its single-config path runs it as is),
    or with `tile` None its production candidates (`_candidates`)."""
    import triton

    tuner = kernel._attn_fwd
    saved = tuner.configs
    tuner.configs = _candidates(kernel) if tile is None else [
        triton.Config({"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n}, num_warps=tile.num_warps,
                      num_stages=tile.num_stages)
    ]
    try:
        yield
    finally:
        tuner.configs = saved


@contextlib.contextmanager
def _launch_device(device: torch.device):
    if device.type != "cpu":
        yield
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("modelopt's Triton kernel needs a CUDA device, or TRITON_INTERPRET=1 set before import on CPU")
    # attention() enters torch.cuda.device(q.device) around each launch, which rejects CPU tensors; under Triton's
    # CPU interpreter there is no device to select, so for CPU launches that context is a no-op. Nothing else changes.
    real = torch.cuda.device
    with mock.patch.object(torch.cuda, "device", lambda d: contextlib.nullcontext() if _is_cpu(d) else real(d)):
        yield


def _is_cpu(d) -> bool:
    return isinstance(d, torch.device) and d.type == "cpu"


class _Handed(Exception):
    """Raised by the capture in place of the plugin's kernel call, carrying the K/V it was handed."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        super().__init__("captured")
        self.views = (k_cache, v_cache)


def _plugin_kv_views(plugin: types.ModuleType, kv_cache: torch.Tensor, layer: Layer):
    """Run the plugin's forward for `layer`'s backend on a one-sequence prefill; return the K/V views it hands its
    kernel."""

    def capture(*args, k_cache=None, v_cache=None, **kwargs):
        raise _Handed(k_cache, v_cache)

    dev, kv_heads, head_size = kv_cache.device, layer.num_kv_heads, layer.head_size
    # A prefill launch with an active sparse transform, so every release takes its Triton path (0.45 sends
    # decode-only skip-softmax launches to vLLM's native path).
    state = dict(num_kv_heads=kv_heads, head_size=head_size, scale=head_size**-0.5,
                 sparse_kw={"skip_softmax_threshold": 0.5})
    starts, lens, table = (torch.tensor(x, dtype=torch.int32, device=dev) for x in ([0, 2], [2], [[0]]))
    query = torch.zeros(2, kv_heads, head_size, dtype=kv_cache.dtype, device=dev)
    output = torch.empty_like(query)
    with mock.patch.object(plugin, "triton_attention", capture):
        try:
            if layer.backend_name == "FLASHINFER":
                # ModelOptSparseFlashInferImpl.forward is this call with itself as the impl; its metadata carries
                # the fields the plugin's patched FlashInferMetadataBuilder.build attaches. The cache write it may
                # issue first is vLLM's CUDA op, and the harness has written the tokens already.
                meta = types.SimpleNamespace(
                    use_cascade=False, _modelopt_block_table=table, _modelopt_seq_lens=lens,
                    _modelopt_query_start_loc=starts, _modelopt_num_actual_tokens=2, _modelopt_max_query_len=2,
                    _modelopt_max_seq_len=2, _modelopt_causal=True)
                with mock.patch.object(plugin, "_maybe_update_flashinfer_cache", lambda *a, **k: None):
                    getattr(plugin, FLASHINFER)(types.SimpleNamespace(**state), None, types.SimpleNamespace(),
                                                query, query, query, kv_cache, meta, output)
            else:
                impl = object.__new__(plugin.ModelOptSparseAttentionImpl)  # as the plugin's _clone_sparse_impl does
                impl.__dict__.update(state)
                meta = types.SimpleNamespace(use_cascade=False, causal=True, num_actual_tokens=2, max_query_len=2,
                                             max_seq_len=2, query_start_loc=starts, seq_lens=lens, block_table=table)
                impl.forward(types.SimpleNamespace(), query, query, query, kv_cache, meta, output)
        except _Handed as handed:
            return handed.views
    return None


@contextlib.contextmanager
def _backend(mo: _Modelopt, layer: Layer, release: VllmRelease | None):
    """In replay, the recorded release's stand-in vLLM for the duration, the plugin's names rebound to it."""
    if mo.live:
        yield
        return
    if release is None:
        raise ContractError(
            f"vLLM is not installed, so the modelopt plugin's split needs the recorded release to replay: bind it "
            f"(ModeloptSubject.for_release) or hand it a replayed layer; {layer.describe()}"
        )
    # 0.46+ caches the detected layout per process (functools.cache); each replayed layer must ask afresh.
    clear = getattr(getattr(mo.plugin, "_flash_attention_kv_cache_layout", None), "cache_clear", lambda: None)
    try:
        scope = vllm_api.replaying(release.recording, rebind=(mo.plugin,))
    except vllm_api.ApiError as e:
        raise ContractError(str(e)) from None
    with scope:
        clear()
        try:
            yield
        finally:
            clear()


@functools.cache
def _load() -> _Modelopt:
    """Import nvidia-modelopt as KVCONFORM_MODELOPT selects it, and its vLLM plugin (against replay stand-ins
    when vLLM is not installed)."""
    spec = os.environ.get(ENV, "")
    tree = os.path.isdir(spec)
    if tree:
        sys.path.insert(0, os.path.abspath(spec))
    try:
        import modelopt
    except ImportError as err:
        hint = f"`pip install nvidia-modelopt=={spec}`" if spec and not tree else "`pip install .[modelopt]`"
        raise ModeloptUnavailable(
            f"nvidia-modelopt is not importable ({err}); install it with {hint}"
            + (f" (or fix {ENV}={spec}, which is no modelopt source tree)" if tree else "")
        ) from err
    found = os.path.dirname(os.path.dirname(os.path.abspath(modelopt.__file__)))
    version = getattr(modelopt, "__version__", "unknown")
    if tree and found != os.path.abspath(spec):
        raise ModeloptUnavailable(f"{ENV}={spec} but modelopt was imported from {found}")
    if spec and not tree and version != spec:
        raise ModeloptUnavailable(
            f"{ENV}={spec} but nvidia-modelopt {version} is installed; `pip install nvidia-modelopt=={spec}`"
        )
    live = vllm_api.real_vllm()  # not the stand-ins a replayed layer's call runs under
    try:
        plugin = importlib.import_module(PLUGIN) if live else _import_replayed(PLUGIN)
    except ModuleNotFoundError as err:
        if err.name == PLUGIN:
            raise ModeloptUnavailable(f"nvidia-modelopt {version} has no vLLM plugin ({PLUGIN}; it first shipped "
                                      f"in 0.45.0)") from err
        raise ModeloptUnavailable(f"nvidia-modelopt {version}'s vLLM plugin does not import: {err}") from err
    kernel = sys.modules[plugin.triton_attention.__module__]
    installer = importlib.util.find_spec(RUNTIME) is not None  # found, not imported: it imports vLLM's model layers
    return _Modelopt(f"{version} (tree {spec})" if tree else version, plugin, kernel, live, installer)


def _import_replayed(name: str) -> types.ModuleType:
    # The plugin imports its vLLM names at module level: under the stand-ins installed now (a replayed layer's
    # call), else the newest recorded release's, which are gone again afterwards (a split rebinds the names to the
    # release it replays).
    if vllm_api.modules.replayed() is not None:
        return importlib.import_module(name)
    for version in reversed(store.releases()):
        rec = store.load(version)
        if rec.api is not None:
            break
    else:
        raise ModeloptUnavailable("no recording holds vLLM's layout API to import the plugin against; re-record "
                                  "with `nox -s probe -- <release>`")
    with vllm_api.replaying(rec):
        return importlib.import_module(name)
