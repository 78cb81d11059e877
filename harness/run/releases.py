"""The releases a run checks and their contracts: probed live when vLLM is installed (with drift against the
recording), else replayed from the recording."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from harness import matrix
from harness.contract import Contract, ContractError
from harness.matrix import build
from harness.matrix.build import Build
from harness.probe import ProbeError, probe
from harness.probe import release as installed_release
from harness.recordings import store
from harness.recordings.drift import drift
from harness.recordings.store import Recording


@dataclass(frozen=True)
class ReleaseContracts:
    """One release's contracts for this session, live (probed, with drift against the recording) or replayed."""

    release: str
    source: str  # "live" or "replay"
    contracts: tuple[Contract, ...]
    error: str = ""  # the contract-error when they could not be read
    drift: tuple[str, ...] = ()
    unmodelled: dict[str, list[str]] = field(default_factory=dict, compare=False)  # store.unmodelled
    recording: Recording | None = field(default=None, compare=False, repr=False)  # replay: the stand-ins' source
    allocations: dict | None = field(default=None, compare=False, repr=False)  # the whole-model allocation record
    build: Build | None = None  # the vLLM build its contracts came from: the installed one, or the recording's

    def describe(self) -> str:
        """How the contracts were read, and their distinct geometries by family, with the backends that hand them
        (every geometry by name: docs/contracts.md, or `python -m harness.recordings.store table`)."""
        if self.error:
            return f"{self.release}: contract-error: {self.error}"
        how = "live probe of the installed vLLM" if self.source == "live" else "replay of the recorded fixture"
        kinds: dict[str, tuple[set[Contract], dict[str, None]]] = {}
        for c in self.contracts:
            kind = (f"{c.layout.family}{'+diffkv' if c.diff_kv else ''}"
                    f"{'' if c.cache_dtype == 'auto' else '@' + c.cache_dtype}")
            geometries, backends = kinds.setdefault(kind, (set(), {}))
            geometries.add(c)
            backends[c.origin.backend_name] = None
        return (f"{self.release}: {how}, {len(self.contracts)} contracts in {len(set(self.contracts))} geometries: "
                + ", ".join(f"{kind} x{len(g)} ({', '.join(b)})" for kind, (g, b) in kinds.items()))


def vllm_installed() -> bool:
    """Whether a vLLM is importable here (its release is then probed live)."""
    return importlib.util.find_spec("vllm") is not None


def load_release(release: str, contracts_dir: Path) -> ReleaseContracts:
    """The release's contracts: probed live when vLLM is installed (with drift against the recording), else
    replayed from the recording."""
    if not vllm_installed():
        try:
            recording = store.load(release, contracts_dir)
            return ReleaseContracts(release, "replay", recording.contracts, recording=recording,
                                    unmodelled=store.unmodelled(recording),
                                    allocations=recording.observations.get("allocations"),
                                    build=build.recorded(recording.observations, release))
        except ContractError as e:
            return ReleaseContracts(release, "replay", (), str(e))
    here = build.installed()
    try:
        live = probe()
    except ProbeError as e:
        return ReleaseContracts(release, "live", (), str(e), build=here)
    if release != "main" and live.release != release:
        return ReleaseContracts(release, "live", (), f"the installed vLLM is {live.release}, not {release}", build=here)
    unmodelled = store.unmodelled(live)
    if release not in store.releases(contracts_dir):
        return ReleaseContracts(release, "live", live.contracts, drift=(f"no recording of {release} to compare",),
                                unmodelled=unmodelled, allocations=live.observations.get("allocations"), build=here)
    return ReleaseContracts(release, "live", live.contracts, unmodelled=unmodelled,
                            drift=tuple(drift(store.load(release, contracts_dir), live)),
                            allocations=live.observations.get("allocations"), build=here)


def releases_asked(asked: list[str], contracts_dir: Path) -> list[str]:
    """Release names from what was asked ('recorded' = every recording); the installed vLLM's when nothing was.
    ValueError (a usage error) when nothing was asked and vLLM is not installed."""
    if not asked:
        if not vllm_installed():
            raise ValueError("vLLM is not installed: name the release(s) to replay with --kvconform-release "
                             f"(recorded: {', '.join(store.releases(contracts_dir))})")
        asked = [installed_release()]
    names = [r for a in asked for r in (store.releases(contracts_dir) if a == "recorded" else [a])]
    if not vllm_installed():
        recorded = store.releases(contracts_dir)
        for name in names:
            if name not in recorded:
                raise ValueError(f"vllm {name} has no recording in {contracts_dir} (recorded: {', '.join(recorded)}); "
                                 f"to check it: {_how_to_record(name)}")
    return names


def _how_to_record(name: str) -> str:
    try:
        matrix.get(name)
    except matrix.UnknownRelease:
        return f"add it to kvconform's matrix.toml, then run `nox -s probe -- {name}` in a kvconform checkout"
    except OSError:  # matrix.toml unreadable: the recording is still the way in
        pass
    return f"run `nox -s probe -- {name}` in a kvconform checkout (or install vllm=={name} and run live)"
