"""The package's own structure: no module imports another that (directly or through others) imports it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent / "herdrl"


def import_graph() -> dict[str, set[str]]:
    """herdrl module -> the herdrl modules it imports anywhere in its file (function-level imports included:
    a lazy import only hides a cycle until the day both modules are needed at import time)."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("herdrl"):
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            # A module importing its own package (herdrl.env.vector -> herdrl.env) runs no new code: not a cycle.
            graph[name] |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the finder finds one
    assert find_cycle(import_graph()) is None


def test_every_python_snippet_in_the_docs_names_only_what_it_imports_or_defines(tmp_path):
    """A reader copies one snippet: it must import or define everything it uses (ruff's undefined-name rule on
    each snippet alone)."""
    import re
    import subprocess
    import sys

    pages = [ROOT.parent / "README.md", *sorted((ROOT.parent / "docs").glob("*.md"))]
    for page in pages:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            (tmp_path / f"{page.stem}_{i}.py").write_text(block)
    ruff = Path(sys.executable).parent / "ruff"
    out = subprocess.run([str(ruff), "check", "--isolated", "--no-cache", "--select", "F821", "--output-format",
                          "concise", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_rollout_never_imports_offline():
    """offline/ sits above rollout/: the algorithm passes the recorder and the dataset source down (issue 63)."""
    graph = import_graph()
    below = {name: sorted(t for t in targets if t.startswith("herdrl.offline"))
             for name, targets in graph.items() if name.startswith("herdrl.rollout")}
    assert not any(below.values()), {name: found for name, found in below.items() if found}


@pytest.mark.xdist_group("cluster")
def test_a_grouped_test_is_scheduled_as_its_group(request):
    """Under ``--dist loadgroup`` (`make test`) xdist keeps a group on one worker only if the test's node id ends
    in ``@group``; pytest 9.2 stopped reading the field xdist 3.8 writes it to, and the cluster tests ran on both
    workers at once (conftest.py puts the suffix back)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under --dist loadgroup")
    assert request.node.nodeid.endswith("@cluster")
