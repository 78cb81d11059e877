"""Every check kvconform records, each declared once: what it needs of a subject, what its examples launch, where its
items run, how its examples are drawn, and what its stored words mean for it. The runner, the plugin, the report and
the benchmarks read these declarations. A check with a suite (`module`, test_<name> in conformance/, whose `CHECK`
is its declaration here) is implemented in harness/checks/<name>.py: its targets where it has its own, its draws
and its body (harness.run.implementation says what the runner asks of it). Adding one is that module, its suite
and its line here (and in CHECKS).

Launches: `subject` examples run the subject's kernels (they are the kernel examples, wait for the warm-up and are
counted by the benchmarks); `vllm` examples run vLLM's own device op; `none` look at views of a tensor and cost about
1/20 of a launch, so they get CHEAP_FACTOR times the examples, up to the check's `most` where more were measured to
catch next to nothing more. Items run in `order` (stored regressions first).
A check with no suite module (`module` empty) is recorded by another's: drift by the contracts suite, install by
the nox session, `K/V checks` for the geometries no K/V check covers. This module imports nothing (nox's own
interpreter reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHEAP_FACTOR = 5  # examples of a check that launches nothing, per example of one that launches kernels
# The view checks' generated examples of an item, past which they caught almost nothing more: at the H200's sizes,
# over the default subset, the 16 wrong consumers' generated examples caught the same 1,413 items with 40 and with 60
# an item, and 1,414 with 300 (docs/measurements.md).
VIEW_MOST = 60


@dataclass(frozen=True)
class Check:
    """One check: its name in result lines, the subject capabilities it needs (harness.subjects), what its examples
    launch, its items' place in a run, what its words mean, and the one sparsity mode its cases take where it takes
    one."""

    name: str
    needs: frozenset[str] = frozenset()
    launches: str = "none"  # "subject", "vllm" or "none"
    order: int = 1
    says: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    module: str = ""  # its suite module under conformance/ ("" when another records it)
    mode: str = ""  # the one sparsity mode its examples take ("": every mode)
    most: int = 0  # the most examples CHEAP_FACTOR brings an item to (0: no such bound)
    models: bool = False  # its targets are whole-model allocations: a release whose allocation was not read has none

    @property
    def kernels(self) -> bool:
        """Its examples launch the subject's kernels."""
        return self.launches == "subject"

    @property
    def hands_cache(self) -> bool:
        """It hands the subject a layer's kv_cache, so the subject's `supports_layer(layer)` is asked first."""
        return bool(self.needs & {"split", "transfer"})

    @property
    def asks_case(self) -> bool:
        """It runs the subject's forwards, so the subject's `supports(case)` is asked first."""
        return "forward" in self.needs

    def budget(self, max_examples: int) -> int:
        """Generated examples per item under a profile of `max_examples`: CHEAP_FACTOR times it for a check that
        launches nothing, at most `most` but never fewer than max_examples itself."""
        if self.launches != "none":
            return max_examples
        count = max_examples * CHEAP_FACTOR
        return min(count, max(max_examples, self.most)) if self.most else count


INSTALL = Check("install", order=0)
CONTRACTS = Check("contracts", order=1, module="test_contracts")
DRIFT = Check("drift", order=1, says={"bit-identical": "no drift", "differs": "drift"})
SPLIT_AGREES = Check("split-agrees", frozenset({"split"}), module="test_split",
                     says={"bit-identical": "agrees", "differs": "disagrees"}, most=VIEW_MOST)
REJECTS_MALFORMED = Check("rejects-malformed", frozenset({"split"}), module="test_malformed", most=VIEW_MOST)
TRANSFER = Check("transfer", frozenset({"transfer"}), module="test_transfer")
MODEL_TRANSFER = Check("model-transfer", frozenset({"connector"}), module="test_model_transfer", models=True,
                       says={"bit-identical": "moved exactly", "differs": "moved wrong"})
RELAYOUT = Check("relayout", frozenset({"transfer"}), module="test_relayout",
                 says={"bit-identical": "values kept", "rejected": "refused", "differs": "values moved"})
KV_CHECKS = Check("K/V checks", order=1)  # the not-applicable lines of geometries no K/V check covers
VLLM_WRITE = Check("vllm-write", launches="vllm", order=1, module="test_vllm_write")
ORACLE = Check("oracle", frozenset({"forward"}), launches="subject", order=2, module="test_oracle",
               says={"differs": "out of tolerance"})  # its items are the longest: they start first
BIT_IDENTITY = Check("bit-identity", frozenset({"split", "forward"}), launches="subject", order=3,
                     module="test_bit_identity")
DETERMINISM = Check("determinism", frozenset({"split", "forward"}), launches="subject", order=3,
                    module="test_determinism", says={"differs": "nondeterministic"})
ULP_AUTOTUNED = Check("ulp-autotuned", frozenset({"split", "forward", "autotune"}), launches="subject", order=3,
                      module="test_ulp_autotuned", mode="none", says={"differs": "beyond the rounding bound"})

# In the order a reader follows a release: could it be installed and read, then the layout, then the kernels.
CHECKS = (INSTALL, CONTRACTS, DRIFT, SPLIT_AGREES, REJECTS_MALFORMED, TRANSFER, RELAYOUT, MODEL_TRANSFER, KV_CHECKS,
          BIT_IDENTITY, DETERMINISM, ORACLE, VLLM_WRITE, ULP_AUTOTUNED)
KERNEL_CHECKS = tuple(c.name for c in CHECKS if c.kernels)
BY_NAME = {c.name: c for c in CHECKS}


def get(name: str) -> Check:
    """The declaration of the check named `name`."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"no check named {name!r}; declared: {', '.join(BY_NAME)}") from None


def says(check: str, word: str) -> str:
    """What stored outcome word `word` means for `check` (the word itself where the check does not say)."""
    known = BY_NAME.get(check)
    return known.says.get(word, word) if known else word
