"""The package's shape: its modules import in one direction, and none grows past a size one
can read whole."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "farm_sdk")
MODULES = sorted(name[: -len(".py")] for name in os.listdir(PACKAGE) if name.endswith(".py"))
MAX_LINES = 450


def imported(module):
    """The package's modules that `module` imports, wherever the import stands (under
    `if TYPE_CHECKING:` or in a function too); "__init__" for the package itself."""
    with open(os.path.join(PACKAGE, module + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or (node.level == 0 and (node.module or "").split(".")[0] == "farm_sdk"):
                parts = (node.module or "").split(".")
                inside = parts[1:] if node.level == 0 else [p for p in parts if p]
                if inside:
                    found.add(inside[0])
                else:  # `from . import x`: a module, or a name of the package's __init__
                    found.update(a.name if a.name in MODULES else "__init__" for a in node.names)
            elif node.level > 1:
                raise AssertionError(f"{module}: an import from above the package")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "farm_sdk":
                    found.add(parts[1] if len(parts) > 1 else "__init__")
    found.discard(module)
    return found


def test_the_modules_import_each_other_in_one_direction():
    graph = {module: imported(module) for module in MODULES}
    upward = sorted(m for m, deps in graph.items() if m != "__init__" and "__init__" in deps)
    assert not upward, f"modules importing the package's __init__ (import the module that defines the name): {upward}"
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError("an import circle: " + " -> ".join(path[path.index(module) :] + [module]))
        if module in done:
            return
        path.append(module)
        for dependency in sorted(graph[module]):
            visit(dependency)
        path.pop()
        done.add(module)

    for module in MODULES:
        visit(module)


def test_the_import_reader_finds_each_form_the_package_uses():
    """`from .x import y`, `from . import x` (a module) and `from . import y` (a name of the
    package): the check above sees an import written in any of them."""
    assert imported("harbor") >= {"aio", "errors", "_harbor_task"}
    assert imported("__init__") >= {"aio", "client", "errors", "models", "_version"}
    assert imported("client") >= {"_calls", "_core", "_http", "models"}


@pytest.mark.parametrize("module", MODULES)
def test_no_module_is_longer_than_can_be_read_whole(module):
    with open(os.path.join(PACKAGE, module + ".py"), encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    assert lines <= MAX_LINES, f"farm_sdk/{module}.py has {lines} lines (at most {MAX_LINES}): split it"
