"""The package's import graph matches docs/architecture.md: objectives are pure, the module
imports neither callbacks nor tracking, and every top-level file and folder is in the
documented layout."""
from __future__ import annotations

import ast
import re

from helpers import ROOT

PACKAGE = ROOT / "src" / "paw_lightning"


def imports(path) -> set[str]:
    """Every module a file imports (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_objectives_know_nothing_of_lightning_or_the_model():
    for path in (PACKAGE / "objectives").glob("*.py"):
        bad = sorted(n for n in imports(path) if n.split(".")[0] == "lightning" or n.startswith(("paw_lightning.module", "paw_lightning.model", "paw_lightning.data")))
        assert not bad, f"{path.name} imports {bad}: objectives are tensors in, LossOutput out"


def test_the_module_imports_no_callbacks_and_no_tracking():
    bad = sorted(n for n in imports(PACKAGE / "module.py") if n.startswith(("paw_lightning.callbacks", "paw_lightning.tracking")))
    assert not bad, f"module.py imports {bad}"


def test_every_top_level_piece_is_in_the_documented_layout():
    layout = (ROOT / "docs" / "architecture.md").read_text().split("src/paw_lightning/\n", 1)[1].split("```", 1)[0]
    documented = set(re.findall(r"^  (\S+?)/?\s", layout, flags=re.M))
    present = {p.name.removesuffix(".py") if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
               if not p.name.startswith("__") and (p.suffix == ".py" or p.is_dir())}
    documented = {name.removesuffix(".py") for name in documented}
    assert present - documented == set(), f"not in docs/architecture.md's layout: {sorted(present - documented)}"
    assert documented - present == set(), f"docs/architecture.md lists what does not exist: {sorted(documented - present)}"


def _attributes_read_on(tree: ast.AST, name: str) -> set[str]:
    """The attributes read on a local name or ``self.<name>`` (``policy.sampler`` → ``sampler``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == name) or (isinstance(base, ast.Attribute) and base.attr == name):
                found.add(node.attr)
    return found


def test_data_flows_one_way_between_the_data_module_and_the_module():
    """The data module uses the model only through its ``Policy`` protocol (generation) and
    runs no training computation; the module reads only the data module's output,
    ``played``; neither reaches into the other with ``getattr``."""
    data = ast.parse((PACKAGE / "data.py").read_text())
    protocol = next(n for n in data.body if isinstance(n, ast.ClassDef) and n.name == "Policy")
    members = {n.name for n in protocol.body if isinstance(n, ast.FunctionDef)} | {
        n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign)}
    assert _attributes_read_on(data, "policy") <= members
    trainer_reads = [n for n in ast.walk(data) if isinstance(n, ast.Attribute) and n.attr == "lightning_module"]
    assert len(trainer_reads) == 1, "the data module reaches the model in one place, its `policy` property"
    bad = sorted(n for n in imports(PACKAGE / "data.py") if n.startswith(("paw_lightning.module", "paw_lightning.update", "paw_lightning.objectives")))
    assert not bad, f"data.py imports {bad}: the data module runs no training computation"

    module = ast.parse((PACKAGE / "module.py").read_text())
    assert _attributes_read_on(module, "datamodule") <= {"played"}
    for tree, path in ((data, "data.py"), (module, "module.py")):
        reach = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
                 and any(isinstance(a, ast.Attribute) and a.attr in ("datamodule", "lightning_module") for a in ast.walk(n.args[0]))]
        assert not reach, f"{path} lines {reach}: getattr on the other side"
