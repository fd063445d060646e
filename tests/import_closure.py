"""What a kfp-gpu component's code can import: the import closure over kfp_gpu's sources, read with ``ast``.

Every ``import`` statement counts, at module level or inside a function (the steps import lazily), except those
under ``if TYPE_CHECKING:`` and those in a ``try`` whose handler catches ImportError (optional by construction).
``kfp_gpu.steps.entry`` imports the step modules by name (``STEPS``), so those are roots too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _optional(handlers: list[ast.ExceptHandler]) -> bool:
    for h in handlers:
        names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names):
            return True
    return False


def imports_of(source: str, module: str = "", is_package: bool = False) -> set[str]:
    """Dotted names imported by ``source`` (relative imports resolved against ``module``); for ``from X import Y``
    both ``X`` and ``X.Y`` (Y may be a submodule). Pure."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Try) and _optional(node.handlers):
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join([*parts[:keep], *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return {name for name in found if name and name != "__future__"}


def _source(module: str, root: Path) -> tuple[Path, bool] | None:
    base = root.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def closure(roots: Iterable[str], root: Path = REPO, package: str = "kfp_gpu") -> tuple[set[str], set[str]]:
    """(the ``package`` modules reached from ``roots``, the other modules they import). Names that are attributes,
    not modules (``from kfp_gpu.errors import InvalidSpec``) are dropped. Reads files only."""
    ours: set[str] = set()
    theirs: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in ours or name in theirs:
            continue
        if name.split(".")[0] != package:
            theirs.add(name)
            continue
        found = _source(name, root)
        if found is None:
            continue  # an attribute of a module (the module itself is in the closure)
        ours.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo += parents  # importing a.b.c runs a/__init__.py and a/b/__init__.py
        path, is_package = found
        todo += sorted(imports_of(path.read_text(), name, is_package))
    return ours, theirs



# Run inside the image: import every name; a dotted name that is an attribute of its (importable) parent is fine.
CHECK = """
import importlib, json, sys
missing = []
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        parent, _, attr = name.rpartition(".")
        try:
            if parent and hasattr(importlib.import_module(parent), attr):
                continue
        except ImportError:
            pass
        missing.append(f"{name}: {exc}")
    except Exception as exc:
        missing.append(f"{name}: {type(exc).__name__}: {exc}")
print(json.dumps(missing))
"""
