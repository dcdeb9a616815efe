"""The application layer's shape, read from the source (an AST walk, nothing imported): every
runtime import of a quicksilver module points down the stack below, no module imports itself back
through others, an import inside a function says why it is lazy (``# lazy: reason`` in the
statement or on the line above it), and no function in the package runs past 80 lines.

The stack, bottom up: shared leaves (errors, template guard, tokenizer, model resolution, figures) ->
models -> runtime -> sampling (its shared primitives and the structured-output compiler, which know
nothing of each other -> the decoders -> the package's re-exports) -> engine / pipeline -> the package root (``quicksilver.load``) -> the shared
suite and CLI flags -> server / train / bench -> eval -> cli. Imports under ``if TYPE_CHECKING:``
are annotations only and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import quicksilver

ROOT = Path(quicksilver.__file__).parent
RANK = {
    "errors": 0,
    "figures": 0,
    "template_guard": 1,
    "tokenizer": 2,
    "assets": 2,
    "hub": 1,
    "models": 3,
    "runtime": 3.5,
    # sampling's subpackages: core/ and structured/ side by side, decoders/ on core/, then the
    # package's own re-exports
    "sampling.core": 4,
    "sampling.structured": 4,
    "sampling.decoders": 4.2,
    "sampling": 4.4,
    "engine": 5,
    "pipeline": 5,
    "": 6,  # quicksilver/__init__.py
    "live": 7,
    "cli_util": 7,
    "suite": 7,
    "server": 8,
    "train": 8,
    "bench": 8,
    "eval": 9,
    "cli": 10,
}
LAZY_MARK = "# lazy:"


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _unit(module: str) -> str:
    """The stack entry of a module: its top-level package below quicksilver, or, inside sampling/,
    its subpackage (a module of sampling/ outside them names no entry of the stack)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "sampling":
        return f"sampling.{parts[2]}"
    return parts[1] if len(parts) > 1 else ""


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids |= {id(n) for n in ast.walk(node)}
    return ids


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int, bool, str]]:
    """(imported quicksilver module, line, inside a function, source with the line above) per
    runtime import."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    skip, top = _type_only(tree), {id(n) for n in tree.body}
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            stem = ".".join(base + ([node.module] if node.module else []))
            names = [f"{stem}.{a.name}" for a in node.names]
            targets = [n if n in known else stem for n in names]
        elif isinstance(node, ast.ImportFrom):
            stem = node.module or ""
            targets = [
                f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names
            ]
        else:
            targets = [a.name for a in node.names]
        for t in dict.fromkeys(targets):
            if t.split(".")[0] == "quicksilver":
                span = "\n".join(lines[node.lineno - 2 : node.end_lineno])  # the line above too
                out.append((t, node.lineno, id(node) not in top, span))
    return out


def _graph() -> dict[str, list[tuple[str, int, bool, str]]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_every_import_points_down_the_stack() -> None:
    upward = []
    for mod, imports in _graph().items():
        for target, line, _, _ in imports:
            a, b = _unit(mod), _unit(target)
            assert a in RANK and b in RANK, f"{mod} or {target}: a package the stack does not name"
            if a != b and RANK[b] >= RANK[a]:
                upward.append(f"{mod}:{line} imports {target}")
    assert not upward, "imports that do not point down:\n" + "\n".join(upward)


def test_no_module_imports_itself_back() -> None:
    graph = {m: {t for t, *_ in imps} for m, imps in _graph().items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(path[path.index(t) :] + [t]))
            elif t in graph and t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_a_lazy_import_says_why() -> None:
    unmarked = [
        f"{mod}:{line}: {src.splitlines()[-1].strip()}"
        for mod, imports in _graph().items()
        for _, line, inner, src in imports
        if inner and LAZY_MARK not in src
    ]
    assert not unmarked, f"imports inside functions without a '{LAZY_MARK} reason':\n" + "\n".join(
        unmarked
    )


def test_no_function_over_80_lines() -> None:
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
