"""The shape of the code (docs/ARCHITECTURE.md), read from its imports.

Calls go one way: ``mount/`` → the core ``s4fs/`` → ``codec/`` and the stores. These
tests read every module's imports (with :mod:`ast`; imports inside functions count, those
under ``if TYPE_CHECKING:`` do not) and fail on a new import circle or a call against the
grain, naming the modules, so the house keeps its rooms as it grows.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# import name -> folder (pyproject.toml's package-dir)
FOLDERS = {"s4fs": "s4fs", "s4fs.codec": "codec", "s4fs.mount": "mount"}


def _modules() -> dict[str, str]:
    """Every module of the package: import name -> file."""
    out = {}
    for pkg, folder in FOLDERS.items():
        top = os.path.join(ROOT, folder)
        for here, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__" and
                       not (here == top and pkg == "s4fs" and d in ("codec", "mount"))]
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(here, f), top)[:-3].replace(os.sep, ".")
                name = pkg if rel == "__init__" else f"{pkg}.{rel}"
                out[name.removesuffix(".__init__")] = os.path.join(here, f)
    return out


MODULES = _modules()


def _imports(name: str, path: str, *, typing: bool = False) -> set[str]:
    """The package's modules ``name`` imports at run time (``typing``: and those it
    names only for type checking, under ``if TYPE_CHECKING:``)."""
    is_pkg = path.endswith("__init__.py")
    found: set[str] = set()

    def absolute(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        parts = name.split(".") if is_pkg else name.split(".")[:-1]
        parts = parts[:len(parts) - (level - 1)]
        return ".".join(parts + ([module] if module else []))

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            t = node.test
            if not typing and (getattr(t, "id", None) == "TYPE_CHECKING" or
                               getattr(t, "attr", None) == "TYPE_CHECKING"):
                for n in node.orelse:
                    self.visit(n)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            for a in node.names:
                found.add(a.name)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = absolute(node.module, node.level)
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in MODULES else base)

    with open(path, encoding="utf-8") as fh:
        Visitor().visit(ast.parse(fh.read(), path))
    return found


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _circles(imports: dict[str, set[str]] = IMPORTS) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    graph = {m: sorted(d for d in deps if d in imports and d != m)
             for m, deps in imports.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_modules_were_found():
    assert {"s4fs.fs", "s4fs.codec", "s4fs.mount", "s4fs.read.node"} <= set(MODULES)


def test_no_import_circles():
    circles = _circles()
    assert not circles, "modules that import each other (directly or around a circle): " \
        + "; ".join(" ↔ ".join(c) for c in circles)


def _floor_room(module: str) -> str:
    """The room of the house a module is in: a folder of ``s4fs`` (a package) or one
    module at its top (``s4fs.fs``), and ``s4fs.codec`` and ``s4fs.mount``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_loop_between_rooms_even_for_type_checking():
    # the house's floors: a room (a package, or a module at the top) stands above all it
    # imports, type annotations included, so no call needs to run back up (what a lower
    # room needs of a higher one comes in as a port it declares itself)
    rooms: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        deps = rooms.setdefault(_floor_room(name), set())
        deps.update(_floor_room(d) for d in _imports(name, path, typing=True)
                    if d in MODULES and _floor_room(d) != _floor_room(name)
                    and _floor_room(d) != "s4fs")
    rooms.pop("s4fs", None)        # the package's face: it hands names on
    circles = _circles(rooms)
    assert not circles, "rooms that import each other (directly or around a circle): " \
        + "; ".join(" ↔ ".join(c) for c in circles)


def _offenders(rule) -> list[str]:
    return sorted(f"{m} imports {d}" for m, deps in IMPORTS.items() for d in deps
                  if rule(m, d))


def test_only_the_mount_adapter_knows_fuse():
    assert not _offenders(lambda m, d: d.split(".")[0] == "pyfuse3"
                          and not m.startswith("s4fs.mount"))


def test_trio_stays_in_the_mount_and_the_kernel_free_core():
    # s4fs.vfs runs on the mount's event loop (trio) but knows no FUSE binding: its tests
    # drive it with trio.run and a recording fake of the kernel port, without root
    assert not _offenders(lambda m, d: d.split(".")[0] == "trio"
                          and not m.startswith(("s4fs.mount", "s4fs.vfs")))


def test_the_kernel_free_core_calls_nothing_above_it():
    assert not _offenders(lambda m, d: m.startswith("s4fs.vfs") and
                          d.startswith(("s4fs.mount", "s4fs.cli", "s4fs.service")))


ENTRY_POINTS = {"s4fs.cli"}       # the command line starts the daemon: it sits above all


def test_the_core_never_calls_up_into_the_mount():
    assert not _offenders(lambda m, d: d.startswith("s4fs.mount") and
                          not m.startswith("s4fs.mount") and m not in ENTRY_POINTS)


def test_the_codec_knows_no_files_stores_or_filesystem():
    # the one shared piece is the error hierarchy (errors carry their errno)
    assert not _offenders(lambda m, d: m.startswith("s4fs.codec") and
                          d.startswith("s4fs") and not d.startswith("s4fs.codec") and
                          d != "s4fs.errors")


# --- the write and read rooms (s4fs/write/, s4fs/read/) ----------------------------------

def _in(room: str, module: str) -> bool:
    return module == room or module.startswith(room + ".")


def test_the_write_and_read_rooms_never_import_the_filesystem():
    # they talk to it through ports: write.services.Record, write.bases.Listing, and the
    # callbacks a read.NodeReader is given
    assert not _offenders(lambda m, d: (_in("s4fs.write", m) or _in("s4fs.read", m)) and
                          (d in ("s4fs.fs", "s4fs.api") or _in("s4fs.torch", d)))


def test_the_read_room_never_imports_the_write_room():
    assert not _offenders(lambda m, d: _in("s4fs.read", m) and _in("s4fs.write", d))


def test_coding_never_imports_the_write_or_the_read_room():
    # the read room's decode ahead hands batches to coding's pools: coding takes the
    # chunk source and the GPU decode from s4fs.chunks, below both
    assert not _offenders(lambda m, d: _in("s4fs.coding", m) and (
        _in("s4fs.write", d) or d in ("s4fs.fs", "s4fs.api") or _in("s4fs.torch", d) or
        _in("s4fs.read", d)))


# the composition root (s4fs.runtime) is known to those that build or share one; the
# rooms below are passed what they need of it (ports, constructor arguments)
RUNTIME_USERS = {"s4fs.fs", "s4fs.api", "s4fs.paths", "s4fs.cli"}


def test_only_the_filesystem_api_torch_mount_and_cli_import_the_runtime():
    assert not _offenders(lambda m, d: d == "s4fs.runtime" and m not in RUNTIME_USERS and
                          not _in("s4fs.torch", m) and not _in("s4fs.mount", m))


ROOMS = ("s4fs.write", "s4fs.read", "s4fs.coding", "s4fs.codec", "s4fs.mount", "s4fs.parse",
         "s4fs.stores", "s4fs.service", "s4fs.testing", "s4fs.torch")
def _room(module: str) -> str:
    """The room a module (or name) is in; modules in none are the core, room "s4fs"."""
    return next((r for r in ROOMS if _in(r, module)), "s4fs")


def _private_imports() -> list[tuple[str, str]]:
    """(importer, private module or name it imports) for every ``from … import`` whose
    target module path or imported name has a part starting with ``_``."""
    out = []
    for name, path in MODULES.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module or \
                    not node.module.startswith("s4fs"):
                continue
            for a in node.names:
                target = f"{node.module}.{a.name}"
                if any(p.startswith("_") and not p.endswith("__")
                       for p in target.split(".")[1:]):
                    out.append((name, target))
    return out


def test_no_private_name_crosses_a_room():
    bad = [f"{m} imports {target}" for m, target in _private_imports()
           if _room(m) != _room(target)]
    assert not bad, "private names used across rooms: " + "; ".join(sorted(bad))


CLASS_LINES = 400       # a class that needs more is two concepts (docs/ARCHITECTURE.md)


def test_no_class_is_two_concepts():
    big = []
    for name, path in MODULES.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        big += [f"{name}.{n.name} ({n.end_lineno - n.lineno + 1} lines)"
                for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                and n.end_lineno - n.lineno + 1 > CLASS_LINES]
    assert not big, f"classes over {CLASS_LINES} lines: " + ", ".join(sorted(big))
