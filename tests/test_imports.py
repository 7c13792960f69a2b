"""The packages import each other without cycles: the graph of every import statement in them (at module level and
inside functions: a deferred import still ties the two modules together), and of the registries that import every
module of their package (`pkgutil.iter_modules(__path__)`: families, objectives), has no loop."""
from __future__ import annotations

import ast
import os

from conftest import ROOT

PACKAGES = ("ptm", "data_prep", "pretrain", "launchers", "checkpoints_tools", "downstream")


def modules() -> dict[str, str]:
    """Every module of the packages: dotted name -> file."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: str, known: dict[str, str]) -> set[str]:
    """The modules of `known` that module `name` imports (a package's submodules by name, not the package)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    source = open(path, encoding="utf-8").read()
    out = set()
    if path.endswith("__init__.py") and "pkgutil.iter_modules(__path__)" in source:  # a registry: all its modules
        out.update(m for m in known if m.rpartition(".")[0] == name)
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a non-module attribute: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, as its modules in order, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_finder_sees_a_loop():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["pretrain.train"] and "pretrain.config" in graph["pretrain.plan"]  # the graph is real
    assert "pretrain.families.electra" in graph["pretrain.families"]  # with the registries' imports
    loop = cycle(graph)
    assert loop is None, "import cycle: " + " -> ".join(loop)


def test_no_family_or_objective_name_is_compared_outside_its_module():
    """Only pretrain/families/ and pretrain/objectives/ compare architecture, objective or position encoding names;
    everything else reads features and asks the registries (a position encoding's: `ModelConfig.positional`)."""
    import re

    from pretrain import families, objectives

    from pretrain.models.config import HEADS

    names = "|".join(re.escape(n) for n in (*families.REGISTRY, *objectives.REGISTRY) if n not in HEADS)  # "mlm": a head
    compared = re.compile(rf"""\b(arch|objective|position_encoding)\s*(==|!=|not in|in)\s"""
                          rf"""|["']({names})["']\s*(==|!=|not in|in)\s""")
    found = []
    for name, path in modules().items():
        if name.startswith(("pretrain.families", "pretrain.objectives")):
            continue
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
            code = line.split("#")[0]
            if compared.search(code) and not code.lstrip().startswith(("def ", "class ")):
                found.append(f"{path}:{number}: {line.strip()}")
    assert compared.search('if cfg.model.arch == "gpt2":') and compared.search('x = "bert" in archs')  # it finds them
    assert compared.search('t = m.position_encoding in ("learned", "roberta")')
    assert not found, "\n".join(found)




def family_fields_read_outside(source: str, module: str, owners: dict) -> set[str]:
    """The fields of `owners` (field -> the modules allowed to read it) that `source` reads as an attribute of anything
    but `self`, where `module` is not allowed to."""
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in owners and module not in owners[node.attr]
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")}


def test_no_family_field_is_read_outside_its_family():
    """A model field that only one family reads (its `Family.section`: ELMo's character CNN, XLNet's memory, ELECTRA's
    generator, the encoder-decoders' decoder) is read only by the family's modules (pretrain/families/, the objectives,
    the model class it builds, the converters of its own formats); the shared machinery asks the family (its cost
    hooks, `attends`, `export`, checks)."""
    from pretrain import families

    owners = {}
    for family in families.REGISTRY.values():
        for field in family.fields:
            owners.setdefault(field, set()).update([family.model.split(":")[0], *(f.module for f in family.formats)])
    assert {"char_filters", "mem_len", "generator_size", "decoder_layers"} <= set(owners)
    assert family_fields_read_outside("if cfg.model.char_filters:\n    x = self.mem_len", "pretrain.cost",
                                      owners) == {"char_filters"}  # it finds them
    found = {}
    for name, path in modules().items():
        if not name.startswith(("pretrain.families", "pretrain.objectives")):
            fields = family_fields_read_outside(open(path, encoding="utf-8").read(), name, owners)
            found.update({name: fields} if fields else {})
    assert not found, found
