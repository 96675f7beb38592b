"""No module of placer imports a higher layer (the order is the README's "Layers" line)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "placer"
TOP = {"__init__", "__main__"}  # the package itself and ``python -m placer``


def layer_order() -> dict[str, int]:
    """Layer of every top-level part of placer, from the README's one line."""
    line = next(raw for raw in (ROOT / "README.md").read_text().splitlines()
                if raw.startswith("Layers, lowest first:"))
    layers = line.split(":", 1)[1].split("<")
    return {name.strip(): level for level, names in enumerate(layers)
            for name in names.split(",")}


def part_of(path: Path) -> str:
    """``placer/cost/step.py`` -> ``cost``; ``placer/io.py`` -> ``io``."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _is_part(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def placer_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level part) of every ``placer.X`` import, inside functions too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "placer":  # ``from placer import cost``; ``__version__`` is __init__
                names = [f"placer.{a.name}" if _is_part(a.name) else "placer.__init__"
                         for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out += [(node.lineno, n.split(".")[1]) for n in names
                if n.startswith("placer.") and n.count(".") >= 1]
    return out


def test_every_part_of_placer_has_a_layer() -> None:
    order = layer_order()
    parts = {part_of(p) for p in PACKAGE.rglob("*.py")} - TOP
    assert parts - set(order) == set(), "add them to the README's Layers line"


def test_no_module_imports_a_higher_layer_or_a_sibling() -> None:
    order = layer_order()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = part_of(path)
        if source in TOP:
            continue
        for line, target in placer_imports(path):
            if target not in TOP and target != source and order.get(target, 99) >= order[source]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({source}) imports {target}")
    assert wrong == []


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import placer.cost\n\ndef f():\n    from placer.cli import main\n")
    assert placer_imports(module) == [(1, "cost"), (4, "cli")]
