"""No import cycle in ``src/paw_lightning``, and its top-level pieces in layers that import only downwards.

The graph is read from the source with ``ast`` (no module is imported): every ``import`` and
``from … import`` of every module, wherever it stands, since a lazy import inside a function runs
sooner or later; only what is under ``if TYPE_CHECKING:`` is left out. Relative imports are
resolved; ``from a.b import c`` is an edge to the module ``a.b.c`` when there is one, else to
``a.b`` (``c`` is then an attribute; a package means its ``__init__.py``); a package's
``__init__.py`` re-exporting its submodules gives edges like any other file; a string constant that
is exactly a dotted path into the package (the environment registry's classes imported on first
use, the CLI's ``class_path`` defaults) is an edge too. Importing ``a.b.c`` also runs
``a/__init__.py`` and ``a/b/__init__.py``; those implicit edges are not drawn, or every package
whose ``__init__.py`` re-exports a submodule would be a cycle with it.

``LAYERS`` (lowest first) is the order the code shows, not a wish: a top-level module or
subpackage may import only pieces of a strictly lower layer (pieces of one layer import none of
each other). Where it differs from the order one might guess:

- ``model`` is a leaf (loading the model and tokenizer, LoRA): nothing in it knows training, and
  ``training/precision.py`` reads its bf16 probe, so it sits at the bottom, not above the rollout
  (the rollout reaches the policy through an engine and never imports ``model``).
- ``scale`` is the bottom of the training stack: ``training``, ``objectives`` (the distributed
  selection), ``rollout`` and the rest use its collectives. What a checkpoint holds (the gathered
  trainable weights that any world size resumes) is ``scale/checkpointing.py``, next to the
  ``FSDP2Strategy`` that saves it, so ``training`` imports ``scale`` and never the reverse.
- ``progress`` (bars and plain lines) is below the rollout, whose collector draws a bar; it names
  a validation by its epoch itself (``describe_epoch``), which the run summary imports from it.
- ``envs`` is below ``rollout``: the response's action tag and parser that both the collector and
  Search QA's protocol use are ``envs/actions.py``. ``envs`` is above ``objectives`` because the
  world-model environment scores a prediction with RWML's reward (``objectives/rwml.py``).
- ``tracking`` is below ``callbacks`` (the run summary logs through it) and imports only the
  rollout's samples and the training helpers.
- ``data`` is below ``module``: data flows one way, the data module plays episodes and the module
  reads them (typed) and runs the update; the data module imports nothing of the module.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from helpers import ROOT

SRC = ROOT / "src"
PACKAGE = "paw_lightning"

LAYERS: dict[str, int] = {
    "__init__": 0,  # the root package: the version and a log filter
    # leaves: import nothing of the package
    "ranges": 0,  # the declared ranges of settings, as types: jsonargparse only
    "scale": 1, "model": 1, "embedding": 1, "retrieval": 1, "progress": 1, "analysis": 1,
    "cli_checks": 1,  # the CLI's checks before anything is built: the ranges
    "training": 2,  # step helpers: scale's collectives, model's bf16 probe
    "objectives": 2,  # tensors in, losses out: scale's collectives
    "envs": 3,  # environments: retrieval, embedding, RWML's reward
    "rollout": 4,  # engines, the multi-turn collector, samples: envs, objectives, progress
    "input_files": 4,  # the CLI's checks of input files: what the environments read, the CLI's checks' helpers
    # what consumes rollouts
    "metrics": 5, "tracking": 5, "demonstrations": 5, "update": 5,
    "evaluation": 6,  # a held-out evaluation: metrics of played episodes
    "fixed_set": 6,  # the fixed held-out transitions: the demonstrations' scripted players, the rollout's collector
    "data": 7,  # Lightning's data module: plays episodes, imports no module
    "module": 8,  # Lightning's module: reads the data module's played episodes (typed), runs the update
    "callbacks": 9,
    "cli": 10,
    "testing": 11, "__main__": 11,  # the kill harness runs the CLI; ``python -m`` runs it
}


# ------------------------------------------------------------------ the graph
def module_files(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name → file, for every module of ``package`` under ``src``."""
    files = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(node: ast.AST) -> Iterable[ast.AST]:
    """Every node under ``node``, skipping the bodies of ``if TYPE_CHECKING:`` (not their ``else``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _nodes(other)
            continue
        yield child
        yield from _nodes(child)


def module_graph(src: Path, package: str) -> dict[str, dict[str, int]]:
    """Module → {module it imports: line of the first such import}, within ``package``."""
    files = module_files(src, package)

    def resolve(name: str) -> str | None:  # the longest prefix of ``name`` that is a module
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in _nodes(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else resolve(base) for alias in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(rf"{package}(\.\w+)+", node.value):
                targets = [resolve(node.value)]
            for target in targets:
                if target is not None and target != module and target.split(".")[0] == package:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its nodes in import order, the first repeated at the end
    (``["a", "b", "a"]``), or None. Deterministic: nodes and edges are visited in sorted order."""
    done, stack, on_stack = set(), [], set()

    def visit(node: str) -> list[str] | None:
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_stack:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in done and (cycle := visit(nxt)):
                return cycle
        on_stack.discard(stack.pop())
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)):
            return cycle
    return None


def top_level(module: str) -> str:
    """The top-level piece a module belongs to: ``paw_lightning.rollout.engine`` → ``rollout``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: Mapping[str, Mapping[str, int]], layers: Mapping[str, int]) -> list[tuple[str, int, str]]:
    """(module, line, imported module) for each import of a piece of the same or a higher layer."""
    return [(module, line, target) for module, edges in sorted(graph.items()) for target, line in sorted(edges.items())
            if top_level(module) != top_level(target) and layers[top_level(target)] >= layers[top_level(module)]]


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return module_graph(SRC, PACKAGE)


def where(module: str, graph: Mapping[str, Mapping[str, int]], target: str) -> str:
    return f"{module_files(SRC, PACKAGE)[module].relative_to(ROOT)}:{graph[module][target]}"


# ------------------------------------------------------------------ self-tests on fake graphs
def test_find_cycle_reports_a_synthetic_two_module_cycle_in_order():
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({}) is None


def test_module_graph_counts_lazy_and_relative_imports_and_skips_type_checking(tmp_path):
    pkg = tmp_path / "fake"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from fake.sub.b import thing\n")  # a re-export
    (pkg / "a.py").write_text("def f():\n    from fake.sub import b  # lazy\n    return b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake import a\nthing = 1\n")
    (pkg / "c.py").write_text("import fake.sub.b as b\nfrom fake.sub import thing\nNAME = 'fake.a.f'\n")
    graph = module_graph(tmp_path, "fake")
    assert graph == {"fake": {}, "fake.sub": {"fake.sub.b": 1}, "fake.a": {"fake.sub.b": 2}, "fake.sub.b": {},
                     "fake.c": {"fake.sub.b": 1, "fake.sub": 2, "fake.a": 3}}
    assert find_cycle(graph) is None
    (pkg / "sub" / "b.py").write_text("def g():\n    from .. import a  # lazy and relative: closes a → b → a\n")
    graph = module_graph(tmp_path, "fake")
    assert graph["fake.sub.b"] == {"fake.a": 2}
    assert find_cycle(graph) == ["fake.a", "fake.sub.b", "fake.a"]


def test_upward_imports_finds_a_lower_layer_importing_a_higher_one():
    graph = {"p.low.x": {"p.high": 3, "p.low.y": 4}, "p.high": {"p.low.x": 1}, "p.low.y": {}}
    assert upward_imports(graph, {"low": 0, "high": 1}) == [("p.low.x", 3, "p.high")]
    assert upward_imports(graph, {"low": 0, "high": 0}) == [("p.high", 1, "p.low.x"), ("p.low.x", 3, "p.high")]  # peers


# ------------------------------------------------------------------ the package
def test_the_package_has_no_import_cycle(graph):
    cycle = find_cycle(graph)
    if cycle:
        steps = "\n".join(f"  {where(a, graph, b)} imports {b}" for a, b in zip(cycle, cycle[1:]))
        pytest.fail(f"import cycle of {len(cycle) - 1} modules (lazy imports count):\n{steps}\n"
                    "move what both sides need into a module of the lower one")


def test_every_top_level_piece_has_a_layer(graph):
    missing = sorted({top_level(m) for m in graph} - set(LAYERS))
    assert not missing, f"add {missing} to LAYERS in {Path(__file__).name}: above every piece it imports, below every piece that imports it"


def test_imports_point_down_the_layers(graph):
    bad = [f"  {where(m, graph, t)} ({top_level(m)}, layer {LAYERS[top_level(m)]}) imports {t} ({top_level(t)}, layer {LAYERS[top_level(t)]})"
           for m, _, t in upward_imports(graph, LAYERS)]
    assert not bad, ("a piece imports one of its own or a higher layer (LAYERS in tests/test_imports.py):\n" + "\n".join(bad)
                     + "\nmove what is shared down, or change LAYERS where the code shows a better order and say why in its docstring")
