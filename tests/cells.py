"""A connector subject's cell run as users run it, for the live tests that change a package's deciding line in a
copy and see the cell flip; and the calls a package's method makes, for the tests that hold an adapter to them."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def outcomes(out: Path, subject: str, model: str, path: Path | None = None, plugin: str | None = None
             ) -> tuple[set[str], str]:
    """The outcomes of the connector suite's `model` cell for `subject` on the installed release, and the end of its
    output; with `path` first on PYTHONPATH (for the suite and what it starts) and `plugin` loaded by pytest, where
    given. Results and regressions are kept under `out`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path or ""),
                                                                     os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "conformance/test_model_transfer.py", "-q", "-p",
                           "no:cacheprovider", *(["-p", plugin] if plugin else []), "-k", f"model:{model}]",
                           f"--kvconform-subject={subject}", f"--kvconform-results-dir={out / 'results'}",
                           f"--kvconform-regressions-dir={out / 'regressions'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [json.loads(x) for f in sorted((out / "results").glob("*/results*.jsonl"))
             for x in f.read_text().splitlines() if x.strip()]
    got = {x["outcome"] for x in lines if x["geometry"] == f"model:{model}"}
    return got, done.stdout[-3000:] + done.stderr[-2000:]


def calls(fn) -> dict[str, set[str]]:
    """Each callee `fn`'s source calls by name, with the keywords it passes."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            out.setdefault(name, set()).update(k.arg for k in node.keywords)
    return out
