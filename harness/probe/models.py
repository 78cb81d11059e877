"""The whole models the probe asks a release to allocate (harness.probe.allocation): a handful of layers each, every
spec built with the release's own classes, sized so that each view's axes are told apart by their lengths; and the
grid of sizes (`GRID`) the kernel checks draw a model's layer views from, each allocated by the release too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from harness.probe.imports import module
from harness.probe.observe import MODEL_DTYPE, element

IFACE = "vllm.v1.kv_cache_interface"
WORKER = "vllm.v1.worker.utils"
MAMBA = ("vllm.v1.attention.backends.mamba2_attn", "Mamba2AttentionBackend")
INDEXER = ("vllm.v1.attention.backends.mla.indexer", "DeepseekV32IndexerBackend")
CROSS_LAYER_LAYOUT = "BLHNC"  # layers interleaved per block, where the release names layouts
# Manager blocks. 5 is no other size of these models, nor 5 times a split ratio (4): the block axis of any view a
# layer gets is the one axis as long as its kernel blocks.
NUM_BLOCKS = 5
HEADS, HEAD_DIM = 2, 32


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The sizes a model is allocated at: manager blocks, its block sizes times `block_scale`, and the KV heads and
    head size of its attention layers (a layer with heads of its own keeps them)."""

    num_blocks: int = NUM_BLOCKS
    block_scale: int = 1
    heads: int = HEADS
    head_dim: int = HEAD_DIM


RECORDED = Sizing()  # the model-transfer check's sizes, each axis told apart
# The kernel checks' sizes: 2 and 3 manager blocks (as long as the K/V axis), two block sizes, one and two KV heads,
# at the H200's kernel head dim (harness.draws.strategies.GPU), which its warm-up compiles anyway.
GRID = tuple(Sizing(n, s, h, 128) for s in (1, 2) for h in (1, 2) for n in (2, 3, 5))


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer of a model: its spec (built by `spec(iface, backend_class, sizing)`), its backend (a BACKENDS name,
    or a (module, class) of the release), and the layer whose cache it reuses (KV sharing)."""

    spec: Callable[[Any, type, Sizing], Any] | None
    backend: str | tuple[str, str]
    shares: str | None = None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model configuration: its layers by name, the scheduler's block size, the cache dtype, whether its
    layers are interleaved per block (cross-layer), and whether it is allocated on the GRID too (its attention
    layers' sizes are the grid's)."""

    name: str
    about: str
    layers: dict[str, LayerSpec]
    block_size: int = 16
    cache_dtype: str = "auto"
    cross_layer: bool = False
    grid: bool = True


def _full(block_size: int, cache_dtype: str = "auto", heads: int | None = None, **extra: Any
          ) -> Callable[[Any, type, Sizing], Any]:
    def build(iface, cls: type, at: Sizing):
        kw: dict[str, Any] = dict(block_size=block_size * at.block_scale, num_kv_heads=heads or at.heads,
                                  head_size=at.head_dim, dtype=MODEL_DTYPE)
        if cache_dtype != "auto":
            kw.update(dtype=element(cache_dtype), kv_quant_mode=iface.get_kv_quant_mode(cache_dtype))
        kind = iface.SlidingWindowSpec if "sliding_window" in extra else iface.FullAttentionSpec
        return _customized(cls, kind(**kw, **extra))
    return build


def _mamba(block_size: int) -> Callable[[Any, type, Sizing], Any]:
    def build(iface, cls: type, at: Sizing):
        # Two states of 1,280 bytes: no attention page here is a multiple of it. As a hybrid model's config does
        # (cache_config.mamba_page_size_padded, read by the Mamba layer's get_kv_cache_spec), the page is padded to
        # the model's full-attention page at this block size.
        block = block_size * at.block_scale
        attention = 2 * block * at.heads * at.head_dim * MODEL_DTYPE.itemsize
        return iface.MambaSpec(block_size=block, shapes=((4, 16), (2, 8, 16)), dtypes=(MODEL_DTYPE, MODEL_DTYPE),
                               page_size_padded=attention)
    return build


def _mla(block_size: int, head_size: int, indexer: bool = False) -> Callable[[Any, type, Sizing], Any]:
    def build(iface, cls: type, at: Sizing):
        kw: dict[str, Any] = dict(block_size=block_size, num_kv_heads=1, head_size=head_size, dtype=MODEL_DTYPE)
        role = getattr(iface, "SparseCacheRole", None)
        if indexer and role is not None:  # the releases that tell an indexer's cache from the latent one
            kw["cache_role"] = role.INDEXER
        return _customized(cls, iface.MLAAttentionSpec(**kw))
    return build


def _customized(cls: type, spec):
    """The spec as the release's model runner hands it to the planner (GPUModelRunner.get_kv_cache_spec): where
    the release has them, the backend's `indexes_kv_by_block_stride` answer and its customize_spec, or
    worker.utils.customize_attention_spec (kernel block alignment)."""
    customize = getattr(module(WORKER), "customize_attention_spec", None)
    if customize is not None:
        return customize(cls, spec)
    if hasattr(cls, "indexes_kv_by_block_stride") and "indexes_kv_by_block_stride" in {
            f.name for f in dataclasses.fields(spec)}:
        spec = dataclasses.replace(spec, indexes_kv_by_block_stride=cls.indexes_kv_by_block_stride())
    own = getattr(cls, "customize_spec", None)
    return own(spec) if own is not None else spec


def _layers(n: int, build: Callable[[int], LayerSpec]) -> dict[str, LayerSpec]:
    return {f"layers.{i}": build(i) for i in range(n)}


MODELS = (
    ModelSpec("uniform", "4 full-attention layers (FLASH_ATTN), 16-token blocks",
              _layers(4, lambda i: LayerSpec(_full(16), "FLASH_ATTN"))),
    ModelSpec("kernel-split", "4 full-attention layers (FLASHINFER, kernel blocks of at most 64 tokens), 256-token "
              "manager blocks", _layers(4, lambda i: LayerSpec(_full(256), "FLASHINFER")), block_size=256),
    ModelSpec("sliding", "2 full-attention and 2 sliding-window (32 tokens) layers (FLASH_ATTN)",
              _layers(4, lambda i: LayerSpec(_full(16, **({"sliding_window": 32} if i % 2 else {})), "FLASH_ATTN"))),
    ModelSpec("hybrid", "2 full-attention layers (FLASH_ATTN, 64-token blocks) and 2 Mamba layers",
              _layers(4, lambda i: LayerSpec(_mamba(64), MAMBA) if i % 2 else LayerSpec(_full(64), "FLASH_ATTN")),
              block_size=64),
    ModelSpec("hybrid-split", "2 full-attention layers (FLASHINFER, 256-token manager blocks) and 2 Mamba layers",
              _layers(4, lambda i: LayerSpec(_mamba(256), MAMBA) if i % 2 else LayerSpec(_full(256), "FLASHINFER")),
              block_size=256),
    ModelSpec("padded-split", "2 full-attention layers of 2 KV heads and 2 sliding-window layers of 3 (FLASHINFER, "
              "256-token manager blocks): the smaller page does not divide the larger",
              _layers(4, lambda i: LayerSpec(_full(256, heads=3, sliding_window=32) if i % 2 else _full(256),
                                             "FLASHINFER")),
              block_size=256),
    ModelSpec("shared", "4 full-attention layers (FLASH_ATTN), layers.3 reusing layers.1's cache (KV sharing)",
              _layers(4, lambda i: LayerSpec(None, "FLASH_ATTN", "layers.1") if i == 3
                      else LayerSpec(_full(16), "FLASH_ATTN"))),
    ModelSpec("mla-indexer", "2 latent-attention layers (TRITON_MLA, 48-wide latent) each with a sparse indexer cache "
              "(DeepseekV32IndexerBackend, 64-wide key)",
              {**{f"layers.{i}.attn": LayerSpec(_mla(64, 48), "TRITON_MLA") for i in range(2)},
               **{f"layers.{i}.indexer": LayerSpec(_mla(64, 64, indexer=True), INDEXER) for i in range(2)}},
              block_size=64, grid=False),
    ModelSpec("cross-layer", "4 full-attention layers (FLASH_ATTN) interleaved per block",
              _layers(4, lambda i: LayerSpec(_full(16), "FLASH_ATTN")), cross_layer=True),
    ModelSpec("cross-layer-fp8", "4 full-attention layers (TRITON_ATTN, fp8 with per-token-head scales) interleaved "
              "per block (VLLM_KV_CACHE_LAYOUT=BLHNC)",
              _layers(4, lambda i: LayerSpec(_full(16, "fp8_per_token_head"), "TRITON_ATTN")),
              cache_dtype="fp8_per_token_head", cross_layer=True),
)
