"""The marker rule of the fast loop (``python -m pytest -m "not slow"``): a test that runs a fit or
starts a process is marked ``slow``.

A static guard, not a proof: it reads tests/*.py with ``ast`` and flags a test function that is
not marked slow (by a decorator that mentions ``mark.slow``, e.g. on one ``pytest.param``, or a
module-level ``pytestmark``) and whose body, or a helper it calls, or a fixture it requests,
contains one of

- a process start: ``subprocess.*``, ``Popen``, ``check_call``/``check_output``, ``*.spawn(``
  (torch.multiprocessing, torchrun-style launches), ``multiprocessing.Process``, a notebook
  kernel (``NotebookClient``), ``EnvPool(..., num_workers=<anything but 0>)``, or a known
  wrapper from outside tests/ (``KNOWN_WRAPPERS``);
- a fit: ``<anything>.fit(...)`` (``trainer.fit``), ``main(["fit", ...])`` unless the call holds
  ``"--print_config"`` (parse only), or ``PawCLI(...)`` without ``run=False``.

Helpers are the module-level functions and classes of the test file and of helpers.py (a class
counts when one of its methods does); fixtures are those of the file and of conftest.py. What
it cannot see: process starts hidden inside src/ (e.g. ``RolloutDataModule(env_workers=1)``)
and calls through variables; mark those by hand.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUBPROCESS_FUNCTIONS = {"run", "Popen", "call", "check_call", "check_output"}
PROCESS_NAMES = {"Popen", "check_call", "check_output", "NotebookClient"}
KNOWN_WRAPPERS = {"kill_and_resume", "run_point"}  # paw_lightning.testing.kill, experiments/grid.py: start processes


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _direct_reason(call: ast.Call) -> str | None:
    """Why this call starts a process or runs a fit (None: it does neither, as far as we see)."""
    func, name = call.func, _name(call.func)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "subprocess" and name in SUBPROCESS_FUNCTIONS:
        return f"subprocess.{name}"
    if name in PROCESS_NAMES or name in KNOWN_WRAPPERS:
        return name
    if isinstance(func, ast.Attribute) and name in ("spawn", "Process") and ast.unparse(func.value) != "psutil":  # psutil.Process only looks
        return f"{ast.unparse(func)}"
    if name == "EnvPool":
        workers = [k.value for k in call.keywords if k.arg == "num_workers"] + call.args[2:3]
        if workers and not (isinstance(workers[0], ast.Constant) and workers[0].value == 0):
            return f"EnvPool(num_workers={ast.unparse(workers[0])})"
    if isinstance(func, ast.Attribute) and name == "fit":
        return f"{ast.unparse(func)}()"
    if name == "main" and call.args and isinstance(call.args[0], (ast.List, ast.Tuple)):
        items = call.args[0].elts
        if items and isinstance(items[0], ast.Constant) and items[0].value == "fit":
            if not any(isinstance(n, ast.Constant) and n.value == "--print_config" for n in ast.walk(call)):
                return 'main(["fit", ...])'
    if name == "PawCLI" and not any(k.arg == "run" and isinstance(k.value, ast.Constant) and k.value.value is False for k in call.keywords):
        return "PawCLI(run=True)"
    return None


def _called_names(node: ast.AST) -> set[str]:
    return {n for call in ast.walk(node) if isinstance(call, ast.Call) for n in [_name(call.func)] if n}


def _heavy(definitions: dict[str, ast.AST]) -> dict[str, str]:
    """Name → reason for every definition that starts a process or fits, directly or through
    another of ``definitions`` (fixed point)."""
    heavy: dict[str, str] = {}
    for name, node in definitions.items():
        for call in (c for c in ast.walk(node) if isinstance(c, ast.Call)):
            if reason := _direct_reason(call):
                heavy[name] = reason
                break
    changed = True
    while changed:
        changed = False
        for name, node in definitions.items():
            if name not in heavy:
                via = sorted(_called_names(node) & heavy.keys())
                if via:
                    heavy[name], changed = f"{via[0]} → {heavy[via[0]]}", True
    return heavy


def _is_fixture(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list)


def _top_level(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _test_functions(tree: ast.Module):
    """(test function, decorators that apply to it: its own and its class's)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            yield node, node.decorator_list
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    yield item, [*node.decorator_list, *item.decorator_list]


def unmarked_heavy_tests(source: str, helpers: dict[str, ast.AST] | None = None, fixtures: dict[str, ast.AST] | None = None) -> dict[str, str]:
    """Test name → reason, for the tests of ``source`` that fit or start a process unmarked."""
    tree = ast.parse(source)
    module_slow = any(isinstance(n, ast.Assign) and any(_name(t) == "pytestmark" for t in n.targets) and "slow" in ast.unparse(n.value) for n in tree.body)
    local = _top_level(tree)
    shared_fixtures = {name: node for name, node in (fixtures or {}).items() if name not in local}
    heavy = _heavy({**(helpers or {}), **shared_fixtures, **{k: v for k, v in local.items() if not k.startswith("test")}})
    fixture_names = {name for name, node in {**shared_fixtures, **local}.items() if _is_fixture(node)}
    for name in sorted(fixture_names - heavy.keys()):  # a fixture that requests a heavy fixture
        node = {**shared_fixtures, **local}[name]
        via = [a.arg for a in node.args.args if a.arg in heavy]
        if via:
            heavy[name] = f"fixture {via[0]} → {heavy[via[0]]}"
    found = {}
    for test, decorators in _test_functions(tree):
        if module_slow or any("mark.slow" in ast.unparse(d) for d in decorators):
            continue
        reasons = [r for c in ast.walk(test) if isinstance(c, ast.Call) for r in [_direct_reason(c)] if r]
        reasons += [f"{n} → {heavy[n]}" for n in sorted(_called_names(test) & heavy.keys())]
        reasons += [f"fixture {a.arg} → {heavy[a.arg]}" for a in test.args.args if a.arg in heavy and a.arg in fixture_names]
        if reasons:
            found[test.name] = reasons[0]
    return found


def test_every_test_that_fits_or_starts_a_process_is_marked_slow():
    helpers = {k: v for k, v in _top_level(ast.parse((TESTS / "helpers.py").read_text())).items()}
    fixtures = {k: v for k, v in _top_level(ast.parse((TESTS / "conftest.py").read_text())).items() if _is_fixture(v)}
    offenders = [f"{path.name}::{test}: {reason}" for path in sorted(TESTS.glob("test_*.py"))
                 for test, reason in unmarked_heavy_tests(path.read_text(), helpers, fixtures).items()]
    assert not offenders, "mark these @pytest.mark.slow (or make them cheaper), see tests/test_markers.py:\n" + "\n".join(offenders)


def test_the_guard_sees_each_kind_of_call():
    source = '''
import subprocess, pytest
def run_cli(*a):
    return subprocess.run(["x", *a])
class Server:
    def start(self):
        subprocess.Popen(["x"])
@pytest.fixture
def server():
    return Server()
def test_cli(): run_cli("fit")
def test_server(server): pass
def test_fit(): main(["fit", "--trainer.max_epochs=1"])
def test_trainer_fit(cli): cli.trainer.fit(cli.model)
def test_pool(n): EnvPool(f, 2, num_workers=n)
def test_spawn(): mp.spawn(worker, nprocs=2)
def test_cli_runs(): PawCLI(args=["fit"])
def test_print_config(): main(["fit", "--print_config"])
def test_in_process_pool(): EnvPool(f, 2)
def test_cli_objects(): PawCLI(args=[], run=False)
@pytest.mark.slow
def test_marked(): main(["fit"])
@pytest.mark.parametrize("n", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_marked_param(n): EnvPool(f, 2, num_workers=n)
'''
    assert sorted(unmarked_heavy_tests(source)) == ["test_cli", "test_cli_runs", "test_fit", "test_pool", "test_server", "test_spawn", "test_trainer_fit"]
    assert unmarked_heavy_tests("import pytest\npytestmark = pytest.mark.slow\ndef test_fit(): main(['fit'])\n") == {}
