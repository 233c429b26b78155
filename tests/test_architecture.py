"""The package's shape: no import circles, no arrow running back up, no module over the size
goal. Imports are read with ``ast`` (type-only imports count too: a circle is a circle)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"dgemma_struct": ROOT / "src" / "dgemma_struct", "dgemma_struct.kernels": ROOT / "kernels",
            "dgemma_struct.grammars": ROOT / "grammars"}
MAX_LINES = 400

# lower layers that must never import these upper ones (prefix match on module names). The floors,
# bottom up: kernels / errors / results / prompts; engine; constraints; runtime; options; guide;
# repair; scheduling; the verbs (api, streaming, choice_scores); grounding, tools; server, fastapi, cli.
_D = "dgemma_struct."
_VERBS = [_D + m for m in ("api", "streaming", "choice_scores")]
_TOP = [_D + m for m in ("server", "fastapi", "cli", "grounding", "tools", "training", "testing")]
FORBIDDEN = {
    _D + "kernels": [_D + m for m in ("engine", "constraints", "guide", "repair", "scheduling", "runtime")] + _VERBS + _TOP,
    _D + "engine": [_D + m for m in ("constraints", "guide", "repair", "scheduling", "runtime", "options")] + _VERBS + _TOP,
    _D + "constraints": [_D + m for m in ("engine", "guide", "repair", "scheduling", "runtime")] + _VERBS + _TOP,
    _D + "runtime": [_D + m for m in ("constraints", "guide", "repair", "scheduling", "options")] + _VERBS + _TOP,
    _D + "options": [_D + m for m in ("engine", "constraints", "guide", "repair", "scheduling", "runtime")] + _VERBS + _TOP,
    _D + "guide": [_D + m for m in ("repair", "scheduling", "runtime")] + _VERBS + _TOP,
    _D + "repair": [_D + "scheduling"] + _VERBS + _TOP,
    _D + "scheduling": _VERBS + _TOP,
    _D + "api": _TOP,
    _D + "streaming": _TOP,
    _D + "choice_scores": _TOP,
}
ROOT_MODULES_MAX = 12   # the package root shows the layers; the rest lives in role packages


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = path
    return mods


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            out.update(c for c in candidates if c in mods and c != name)
        graph[name] = out
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_no_arrow_runs_back_up():
    graph = _graph()
    bad = [(src, dst) for src, dsts in graph.items() for dst in dsts for low, ups in FORBIDDEN.items()
           if (src == low or src.startswith(low + ".")) for up in ups if dst == up or dst.startswith(up + ".")]
    assert bad == []


def test_inner_modules_do_not_import_the_package_face():
    """``import dgemma_struct`` from inside the package is an arrow back up to ``__init__``."""
    graph = _graph()
    assert sorted(src for src, dsts in graph.items() if "dgemma_struct" in dsts and src != "dgemma_struct") == []


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_size(name):
    n = len(_modules()[name].read_text().splitlines())
    assert n <= MAX_LINES, f"{name} has {n} lines (goal: at most {MAX_LINES})"


def test_every_package_is_listed_for_setuptools():
    """An installed (non-editable) copy has only the packages pyproject lists."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages - listed == set()


def test_the_root_is_small():
    root = ROOT / "src" / "dgemma_struct"
    modules = sorted(p.name for p in root.glob("*.py"))
    assert len(modules) <= ROOT_MODULES_MAX, modules


# The feature packages (grounding, tools) share one layout on purpose: each has its own ``api`` (verbs),
# ``constraint`` (what it compiles to) and ``grammar``; ``render`` is a chat example in training and a
# source list in grounding. Any other repeated file name is two things under one name, or one thing twice.
SHARED_LAYOUT = {
    "api": {"dgemma_struct.api", "dgemma_struct.grounding.api", "dgemma_struct.tools.api"},
    "constraint": {
        "dgemma_struct.constraints.constraint",
        "dgemma_struct.grounding.constraint",
        "dgemma_struct.tools.constraint",
    },
    "grammar": {"dgemma_struct.grounding.grammar", "dgemma_struct.tools.grammar"},
    "render": {"dgemma_struct.grounding.render", "dgemma_struct.training.render"},
}


def test_no_duplicate_module_names_across_packages():
    seen: dict[str, set[str]] = {}
    for name, path in _modules().items():
        if path.name != "__init__.py":
            seen.setdefault(path.stem, set()).add(name)
    repeated = {k: v for k, v in seen.items() if len(v) > 1}
    assert repeated == SHARED_LAYOUT


def _kind_tests(tree: ast.AST) -> list[int]:
    """Lines that test a constraint's kind: ``<c|constraint|….c>.kind`` in a comparison, or
    ``ConstraintKind`` used at all."""
    def is_constraint_kind(node: ast.AST) -> bool:
        if not (isinstance(node, ast.Attribute) and node.attr == "kind"):
            return False
        owner = node.value
        name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        return name in ("c", "constraint", "inner")

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(map(is_constraint_kind, [node.left, *node.comparators])):
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "ConstraintKind":
            lines.append(node.lineno)
    return lines


def test_the_kind_check_finds_one():
    assert _kind_tests(ast.parse('j = session.c.kind == "json"')) == [1]
    assert _kind_tests(ast.parse("j = c.partial_value(t)")) == []


def test_only_constraints_switch_on_a_constraint_kind():
    """Repair, streaming, the server and the verbs ask the constraint (``partial_value``,
    ``error_offset``, ``junk_paths``, ``split_reasoning``) instead of testing its kind string."""
    found = {name: lines for name, path in _modules().items()
             if not name.startswith(_D + "constraints") and (lines := _kind_tests(ast.parse(path.read_text())))}
    assert found == {}


def _private_uses(name: str, path: Path) -> list[str]:
    """``from <a dgemma_struct module> import _x`` and ``<imported dgemma_struct module>._x`` in one module."""
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    modules, found = set(), []   # local names bound to dgemma_struct modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                target = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("dgemma_struct"):
                continue
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{target}.{a.name}")
                elif f"{target}.{a.name}" in _modules():
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.asname and a.name.startswith("dgemma_struct")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_private_check_finds_one(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from dgemma_struct.constraints.closing import _x\nfrom dgemma_struct.training import words\n"
                 "y = words._name(1)\n")
    assert _private_uses("dgemma_struct.m", p) == ["dgemma_struct.constraints.closing._x", "words._name"]


def test_no_module_uses_another_modules_private_names():
    """A name another module needs is public (``_x`` is the module's own business)."""
    found = {name: uses for name, path in _modules().items() if (uses := _private_uses(name, path))}
    assert found == {}
