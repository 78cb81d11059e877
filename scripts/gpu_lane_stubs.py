"""kvconform GPU lane: stand-ins for vLLM dependencies that its import chain reaches but that never touch the KV
cache (structured output, chat formats, tokenizer extras). Each stubbed name is listed here; anything else missing
still fails loudly."""

import importlib.abc
import importlib.machinery
import sys
import types

# Each name: the releases whose import chain (live probe + suites, platform unspecified) stops without it.
STUBBED = {
    "openai_harmony",  # 0.22.1, 0.25.1, 0.26.0: vllm.config.reasoning -> vllm.reasoning -> entrypoints.mcp.tool_server
    "llguidance",  # 0.26.0: vllm.v1.structured_output.backend_guidance's dataclass annotations load it at import
    "xgrammar",  # 0.26.0: vllm.v1.structured_output.backend_xgrammar, likewise
}


class _Stub(types.ModuleType):
    __path__ = []  # a package, so that `import stubbed.sub` works too

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": _refuse, "__module__": self.__name__})


def _refuse(self, *a, **k):
    raise RuntimeError(f"{type(self).__module__} is stubbed on kvconform's GPU lane")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
