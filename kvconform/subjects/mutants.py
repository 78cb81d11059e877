"""Planted-bug variants of the built-in kernel, to show each conformance check can fail.

A mutant is one exact source line of builtin.py and its replacement; the substituted module is written to a temp
file and imported fresh, so the production kernel carries no test hooks. A line that no longer exists raises,
so a mutant cannot silently stop planting its bug. Mutant `<name>` is the class `kvconform.subjects.mutants:<name>`
(`--kvconform-subject mutant:<name>`), which a warm-up process loads again by that spec.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.subjects import builtin


@dataclass(frozen=True)
class Mutant:
    """One planted bug: the line of builtin.py it replaces and the buggy line."""

    name: str
    line: str
    replacement: str


MUTANTS = {
    m.name: m
    for m in (
        # Query head h reads kv head h % kv_heads instead of h // group.
        Mutant("gqa_mapping", "head = kv_head * group + rows % group",
               "head = kv_head + (rows % group) * (num_heads // group)"),
        # Each query sits one position later than it does: it sees the next (future) key.
        Mutant("causal_offset", "q_pos = kv_len - q_len + tok", "q_pos = kv_len - q_len + tok + 1"),
        # Pages come from the next sequence's block-table row.
        Mutant("table_row", "table_row = table_ptr + seq * stride_table",
               "table_row = table_ptr + ((seq + 1) % (tl.num_programs(0) // q_tiles)) * stride_table"),
        # Token-in-page and kv-head strides swapped for K (right for neither NHD nor HND).
        Mutant("kv_stride_axis",
               "k_rows = page * stride_kb + (row * stride_kn + kv_head * stride_kh)",
               "k_rows = page * stride_kb + (row * stride_kh + kv_head * stride_kn)"),
        # Skip-softmax compares log2-unit scores against the threshold's natural log: it drops tiles up to
        # exp(tile_max - running_max) < threshold^ln2, e.g. 0.43 for 0.3, far outside any boundary margin.
        Mutant("skip_threshold_ln", 'skip = (tile_max == float("-inf")) | (tile_max - m_i < log2_threshold)',
               'skip = (tile_max == float("-inf")) | (tile_max - m_i < log2_threshold * 0.6931471805599453)'),
        # A skipped tile's max replaces the running max. (Dropping the guard line instead would plant nothing: a tile
        # is skipped only when its max is below the running max, so max() would not move it.)
        Mutant("skip_running_max", "m_new = tl.where(skip, m_i, m_new)", "m_new = tl.where(skip, tile_max, m_new)"),
        # Skip decided per BLOCK_M query tile, as modelopt does: dropped only if every valid row of the tile may
        # drop it, where this subject declares per-row decisions.
        Mutant("skip_per_query_tile", 'skip = (tile_max == float("-inf")) | (tile_max - m_i < log2_threshold)',
               'skip = tl.zeros([BLOCK_M], tl.int32) + tl.min(((tile_max == float("-inf")) | '
               "(tile_max - m_i < log2_threshold) | ~row_ok).to(tl.int32), 0) == 1"),
    )
}


def mutated_source(mutant: Mutant) -> str:
    """builtin.py's source with the mutant's line replaced; raises if the line is not there exactly once."""
    source = inspect.getsource(builtin)
    lines = source.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == mutant.line]
    if len(hits) != 1:
        raise LookupError(
            f"mutant {mutant.name!r}: line {mutant.line!r} occurs {len(hits)} times in {builtin.__file__}, "
            "expected exactly once; update the mutant to the kernel's current source"
        )
    line = lines[hits[0]]
    lines[hits[0]] = line[: len(line) - len(line.lstrip())] + mutant.replacement + "\n"
    return "".join(lines)


_DIR = tempfile.mkdtemp(prefix="kvconform_mutants_")


def spec(name: str) -> str:
    """The `module:Class` spec of mutant `name`; ValueError for a name no mutant has."""
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    return f"{__name__}:{name}"


def mutant_class(name: str) -> type[builtin.BuiltinSubject]:
    """The BuiltinSubject class compiled from builtin.py with mutant `name` planted, named for it."""
    spec(name)
    module_name = f"kvconform_mutant_{name}"
    if module_name not in sys.modules:
        # Triton reads a kernel's source from its file, so the module must live in a real file.
        path = Path(_DIR) / f"{module_name}.py"
        path.write_text(mutated_source(MUTANTS[name]))
        found = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(found)
        sys.modules[module_name] = module
        try:
            found.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        module.BuiltinSubject.name = f"builtin[mutant {name}]"  # the mutated module's own class, not builtin's
    return sys.modules[module_name].BuiltinSubject


def mutant_subject(name: str) -> builtin.BuiltinSubject:
    """A BuiltinSubject whose kernels are compiled from builtin.py with mutant `name` planted."""
    return mutant_class(name)()


def __getattr__(name: str) -> type[builtin.BuiltinSubject]:
    # `kvconform.subjects.mutants:<name>`: the class is built on first use, so importing this module plants nothing.
    if name in MUTANTS:
        return mutant_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
