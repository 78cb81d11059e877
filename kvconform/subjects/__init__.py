"""kvconform's own subjects by the short names `--kvconform-subject` takes: `modelopt` (nvidia-modelopt's kernel and
vLLM plugin, kvconform.subjects.modelopt), `lmcache-mp` (LMCache's multi-process KV connector and its server,
kvconform.subjects.lmcache_mp), `vllm-example` (vLLM's own ExampleConnector, kvconform.subjects.vllm_example),
`contiguous-views` (the built-in kernel behind a planted performance bug,
kvconform.subjects.slow) and `mutant:<name>` (the built-in kernel with a planted bug, kvconform.subjects.mutants),
beside the core's `builtin`.

A short name stands for a `module:Class` that harness.subjects.load_subject loads: the plugin hands the runner that
spec, so that the warm-up's processes, which load the subject again by its spec, need no name table of their own.
"""

from __future__ import annotations

from harness import subjects as core

NAMED = {"modelopt": "kvconform.subjects.modelopt:ModeloptSubject",
         "contiguous-views": "kvconform.subjects.slow:ContiguousViews",
         "lmcache-mp": "kvconform.subjects.lmcache_mp:LMCacheMP",
         "vllm-example": "kvconform.subjects.vllm_example:VllmExample"}
MUTANT = "mutant:"  # `mutant:<name>`: kvconform.subjects.mutants.MUTANTS


def spec(name: str) -> str:
    """The spec harness.subjects.load_subject loads the subject named `name` by (a short name, `builtin` or
    `module:Class`); ValueError naming `name` when it names no subject."""
    if name.startswith(MUTANT):
        from kvconform.subjects import mutants

        return mutants.spec(name.removeprefix(MUTANT))
    if name in NAMED:
        return NAMED[name]
    if name == core.BUILTIN or ":" in name:
        return name
    raise ValueError(f"unknown subject {name!r}; known: {sorted([core.BUILTIN, *NAMED])}, {MUTANT}<name> or "
                     "module:Class")


def own(name: str) -> bool:
    """The subject named `name` is one of kvconform's own (`builtin`, a short name, or a planted-bug kernel)."""
    return name == core.BUILTIN or name in NAMED or name.startswith(MUTANT)


def load_subject(name: str) -> core.Subject:
    """The subject named `name` (a short name, `builtin` or `module:Class`), imported only when asked for."""
    return core.load_subject(spec(name))
