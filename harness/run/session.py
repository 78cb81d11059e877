"""What every check of one process shares: the subject, the releases and their contracts, the filters asked for,
the device, the run's id and seed, and the sink its result lines go to."""

from __future__ import annotations

import hashlib
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
import torch
from hypothesis import settings

from harness import vllm_api
from harness.contract import Contract, Dims, cache_dtype
from harness.draws.strategies import CPU, GPU, Sizes
from harness.handed.layer import Layer, in_force, layer_for
from harness.results import findings
from harness.run.releases import ReleaseContracts, load_release, releases_asked
from harness.run.sink import Sink
from harness.subjects import DEFAULT_CAPABILITIES, FORWARD, capabilities_of, load_subject

NOMINAL = Dims(num_blocks=8, block_size=16, kv_heads=2, head_dim=64)  # the sizes a layer is asked at per geometry


# The interpreter options that change what it imports: a pasted command must find the modules this run found.
IMPORT_FLAGS = (("isolated", "-I"), ("ignore_environment", "-E"), ("no_site", "-S"), ("no_user_site", "-s"),
                ("safe_path", "-P"))


def pytest_command() -> str:
    """How a printed command starts pytest as this process did, ready to paste into a shell with no venv activated:
    this interpreter by its path, with the options that change what it imports, and -m pytest."""
    flags = [flag for name, flag in IMPORT_FLAGS if getattr(sys.flags, name, 0)]
    return shlex.join([sys.executable, *flags, "-m", "pytest"])


def sizes_for(device: str) -> Sizes:
    """The compile-time sets and size limits examples are drawn from on `device`."""
    return GPU if device.startswith("cuda") else CPU


@dataclass
class Session:
    """The subject, the releases and what of them is asked for, in one process."""

    subject_name: str
    subject_spec: str  # how it was named (load_subject): warm-up processes load it again by this
    subject: object
    releases: list[ReleaseContracts]
    findings: tuple[findings.Finding, ...]
    results_dir: Path
    regressions_dir: Path
    worker: str  # this process's name in result file names: <run>-<worker>
    args: str  # the options that select this session, for repro lines
    device: str
    capabilities: frozenset[str] = DEFAULT_CAPABILITIES  # what the subject declares it can do (harness.subjects)
    backends: tuple[str, ...] = ()  # attention backends whose contracts are checked (empty: every recorded one)
    cache_dtypes: tuple[str, ...] = ()  # cache dtypes likewise
    run: str = ""  # the run's id (harness.results.new_run_id), in every line it writes
    seed: int = 0  # what every item's draws derive from (item_seed)
    command: str = field(default_factory=pytest_command)  # what starts pytest in the commands it prints
    say: Callable[[str], None] = field(default=lambda text: print(text, file=sys.__stderr__, flush=True), repr=False)
    sink: Sink = field(init=False, repr=False)  # made of the fields above: another subject is a dataclasses.replace

    def __post_init__(self) -> None:
        self.sink = Sink(self.results_dir, self.run, self.worker, self.subject_name, self.findings)

    def selects(self, c: Contract) -> bool:
        """Whether the session checks contract `c`: its backend and cache dtype were asked for, and the subject
        serves that backend (a subject's optional `backends`: a plugin of one backend meets no other's caches)."""
        return ((not self.backends or c.origin.backend_name in self.backends) and serves(self.subject, c)
                and (not self.cache_dtypes or c.cache_dtype in self.cache_dtypes))

    @property
    def sizes(self) -> Sizes:
        """What examples are drawn from on this session's device."""
        return sizes_for(self.device)

    def supports(self, r: ReleaseContracts, c: Contract, dims: Dims = NOMINAL, dtype: torch.dtype = torch.bfloat16
                 ) -> str | None:
        """Why the subject cannot read release `r`'s caches of `c` (its own word), None when it can."""
        return supports_layer(self.subject, self.subject_name, layer_of(r, c, dims, dtype), self.capabilities)

    def missing(self, needs: frozenset[str] | set[str]) -> list[str]:
        """The capabilities a check needs that the subject does not declare (empty: the check applies)."""
        return sorted(set(needs) - self.capabilities)


def start(subject_spec: str, asked: list[str], contracts_dir: Path, results_dir: Path, regressions_dir: Path,
          known_findings_dir: Path, device: str, worker: str, args: str, backends: tuple[str, ...] = (),
          cache_dtypes: tuple[str, ...] = (), run: str = "", command: str = "") -> Session:
    """The session of one process. ValueError (a usage error) for a subject, releases, backends or cache dtypes
    that cannot be named."""
    names = releases_asked(asked, contracts_dir)
    subject = load_subject(subject_spec)
    caps = capabilities_of(subject)
    known = findings.load(subject.name, known_findings_dir)
    releases = [load_release(r, contracts_dir) for r in names]
    recorded = {c.origin.backend_name for r in releases for c in r.contracts}
    unknown = sorted(set(backends) - recorded)
    if unknown:
        raise ValueError(f"backend(s) {', '.join(unknown)} not among the session releases' contracts "
                         f"({', '.join(sorted(recorded))})")
    return Session(subject.name, subject_spec, subject, releases, known, results_dir, regressions_dir, worker, args,
                   device, run=run, seed=run_seed(run), capabilities=caps, backends=tuple(backends),
                   cache_dtypes=tuple(cache_dtype(n).name for n in cache_dtypes), command=command or pytest_command())


def run_seed(run: str) -> int:
    """The seed of a run's draws: --hypothesis-seed when given, 0 under a derandomized profile (ci, find), else one
    taken from the run's id (the header prints it: --hypothesis-seed=N draws the same examples again)."""
    if hypothesis.core.global_force_seed is not None:
        return int(hypothesis.core.global_force_seed)
    if settings.default.derandomize:
        return 0
    return int(hashlib.sha1(run.encode()).hexdigest()[:8], 16)


def serves(subject: object, c: Contract) -> bool:
    """Whether a layer of contract `c` can reach `subject`: every backend's can, unless the subject names the backends
    it serves (`backends`: a plugin of one backend meets no other's caches)."""
    served = getattr(subject, "backends", None)
    return served is None or c.origin.backend_name in served


def layer_of(r: ReleaseContracts, contract: Contract, dims: Dims, dtype: torch.dtype) -> Layer:
    """The layer value a subject gets for release `r`'s cache of `contract` at `dims`: the backend `contract` was
    read from, vLLM's class live, the recorded stand-in in replay."""
    backend = vllm_api.backend_class(r.recording or r.release, contract.origin.backend_name)
    return layer_for(contract, dims, dtype, backend, r.release, r.recording)


def supports_layer(subject: object, name: str, layer: Layer, capabilities: frozenset[str]) -> str | None:
    """Why `subject` cannot read `layer`'s cache, None when it can. Optional in a subject: a consumer (no forward)
    that says nothing meets every cache; a kernel that says nothing is taken to read model-dtype K/V only, so a
    quantised cache is unsupported for it (never a pass, never a finding) until it declares otherwise."""
    hook = getattr(subject, "supports_layer", None)
    if hook is not None:
        with in_force(layer):
            return hook(layer)
    if FORWARD in capabilities and layer.cache_dtype != "auto":
        return (f"{name} declares no supports_layer: a kernel is taken to read model-dtype K/V only, not a "
                f"{layer.cache_dtype} cache")
    return None
