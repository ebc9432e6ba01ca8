"""A handler's own modules: the Python files of its function folder that it imports, which
travel in the bundle with it and are imported in a package of their own per function.

Which files (`own_modules`): those the handler's `import` statements (and its
`importlib.import_module("name")` calls of a literal name) name, read from its source (never
run), and those that theirs name, and so on. `from lines import find_lines` takes the folder's
`lines.py`; `import helpers` takes the package folder `helpers/` (it has an `__init__.py`)
whole, every `.py` file in it. Their data (`own_data`) goes with them: every other file of such
a package folder, and the files a module names by a literal path relative to its own folder
(`Path(__file__).parent / "vocabulary.txt"`, `HERE / "data" / "labels.txt"`,
`os.path.join(HERE, "vocab.txt")`). Nothing else of the folder goes: not its tests, training
scripts, notebooks or other data; a name the folder holds no module for is left to the
installed packages. The builder copies them beside the handler (`handler/` in the bundle), where
the content hash covers them, so that editing one builds a new bundle, and `__file__` finds
them there.

How (`import_module`): each module is compiled from its verified source under the name its
author knows (tracebacks and errors name the user's files) into a package of its own,
`edgeserve_handler_<digest>`, never under its bare name. Two functions that each have a
`lines.py` never meet in `sys.modules`, and an `import lines` anywhere else (another handler,
an installed package, the training scripts) is not handed this one. The modules' imports of
one another (`import lines`, `from helpers import geo`, also inside functions) are routed into
the package by an `__import__` of their own (their `__builtins__`), so every other import
they make is Python's as usual; the `importlib` that `__import__` hands them routes its
`import_module` the same way (it does not go through `__import__`).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

PACKAGE = "edgeserve_handler_"
"""The start of each function's package name; a digest of its files follows."""


def own_modules(handler: Path) -> list[str]:
    """The files of the handler's folder that it imports, directly or through one another, as
    sorted relative POSIX paths (`lines.py`, `helpers/__init__.py`), the handler left out."""
    folder = handler.parent
    found: set[str] = set()
    pending = [handler]
    while pending:
        for relative in _imported_files(pending.pop(), folder):
            if relative not in found and folder / relative != handler:
                found.add(relative)
                pending.append(folder / relative)
    return sorted(found)


def own_data(handler: Path, modules: Sequence[str] | None = None) -> list[str]:
    """The data files the handler's modules (`modules`, found when not given) read beside them:
    every file of their package folders but modules, and the files they name by a literal path
    from their own folder; sorted relative POSIX paths."""
    folder = handler.parent
    modules = own_modules(handler) if modules is None else modules
    found: set[str] = set()
    for package in {name.split("/")[0] for name in modules if "/" in name}:
        found.update(_relative(path, folder) for path in (folder / package).rglob("*"))
    for module in (handler, *(folder / name for name in modules)):
        for literal in _parsed(module).paths:
            found.add(_relative(module.parent / literal, folder))
    found.discard("")
    return sorted(found - {*modules, handler.name})


def _relative(path: Path, folder: Path) -> str:
    """`path` relative to `folder` as a shippable file (a file inside it, no litter), else ""."""
    try:
        relative = path.resolve().relative_to(folder.resolve())
        if not path.is_file() or hidden(relative.parts):
            return ""
    except (OSError, ValueError):  # outside the folder, or not a path at all
        return ""
    return relative.as_posix()


def digest(handler: Path, files: Sequence[str] | None = None) -> bytes:
    """sha256 over the handler and its own modules (`files`, found when not given), names and
    bytes: one per content."""
    hasher = hashlib.sha256(handler.read_bytes())
    for relative in own_modules(handler) if files is None else files:
        hasher.update(b"\0%s\0" % relative.encode() + (handler.parent / relative).read_bytes())
    return hasher.digest()


def import_module(handler: Path, shown: Path) -> ModuleType:
    """Import the handler at `handler` with its own modules, each compiled under its name in
    `shown`'s folder (the source folder, when `handler` is its copy in a bundle)."""
    files = own_modules(handler)
    where = str((handler.resolve(), shown)).encode()
    package = PACKAGE + hashlib.sha256(where + digest(handler, files)).hexdigest()[:16]
    names = frozenset({handler.stem, *(name.split("/")[0].removesuffix(".py") for name in files)})
    scope = {**vars(builtins), "__import__": _router(package, names)}
    _FINDER.spaces[package] = _Namespace(package, handler.parent, shown.parent, names, scope)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return importlib.import_module(f"{package}.{handler.stem}")


def plain(exc: BaseException) -> str:
    """`Type: message` of an exception, with the functions' package names taken out of it
    (`No module named 'helpers.geo'`, not `'edgeserve_handler_0123456789abcdef.helpers.geo'`)."""
    return _PACKAGE_NAME.sub("", f"{type(exc).__name__}: {exc}")


def is_own(filename: str) -> bool:
    """Whether `filename` (a code object's) is a module of some handler imported here."""
    return filename in _SHOWN


def missing_hint(exc: ModuleNotFoundError, shown: Path) -> str:
    """What to do about a module the handler imports and nobody has."""
    name = _PACKAGE_NAME.sub("", exc.name or "").partition(".")[0]
    folder = shown.parent
    if name and (folder / name).is_dir() and not (folder / name / "__init__.py").is_file():
        return (
            f". Hint: {folder / name} is a folder without __init__.py; add one to make it a "
            "package the handler can import"
        )
    return (
        ". Hint: install it, and list it in [handler] requirements so that targets get it; a "
        f"module of your own goes in the function folder ({folder / name}.py, or a package "
        f"folder {folder / name}/ with __init__.py) and is imported with an import statement"
    )


def _imported_files(path: Path, folder: Path) -> Iterator[str]:
    for name in sorted(_parsed(path).names):
        yield from _module_files(folder, name)


@dataclass(frozen=True)
class _Source:
    """What a module's source says of the files it needs: the top-level names of its absolute
    imports (`import_module("a.b")` of a literal name too), wherever they stand (in a function,
    under `try`), and the literal relative paths it holds (`HERE / "data" / "vocab.txt"`:
    "data/vocab.txt" too)."""

    names: frozenset[str] = frozenset()
    paths: frozenset[str] = frozenset()


def _parsed(path: Path) -> _Source:
    """Each content is parsed once (17 ms for functions/ocr's 13 files)."""
    try:
        source = path.read_bytes()
    except OSError:  # importing it says what is wrong
        return _Source()
    key = hashlib.sha256(source).digest()
    if (parsed := _PARSED.get(key)) is None:
        parsed = _PARSED[key] = _parse(source, path)
    return parsed


def _parse(source: bytes, path: Path) -> _Source:
    try:
        tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError):  # importing it says what is wrong, and where
        return _Source()
    names: set[str] = set()
    paths: set[str] = set()
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and _callee(node) in _IMPORTERS and node.args:
            names.add(_text(node.args[0]) or ".")  # a relative or computed name: not ours
        elif isinstance(node, ast.Call) and _callee(node) == "join":  # os.path.join(here, "a")
            paths.add("/".join(_trailing_texts(node.args)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # here / "a" / "b"
            paths.add("/".join(_divided(node)))
        elif (text := _text(node)) is not None and id(node) not in docstrings:
            paths.add(text)
    tops = {name.partition(".")[0] for name in names if not name.startswith(".")}
    return _Source(frozenset(tops), frozenset(filter(_path_like, paths)))


_IMPORTERS = frozenset({"import_module", "__import__"})
"""Calls that import the module their first argument names (importlib's, the builtin)."""


def _callee(node: ast.Call) -> str:
    """The name a call's function goes by: `join` of `os.path.join(...)`, or of `join(...)`."""
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else ""


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _trailing_texts(nodes: Sequence[ast.expr]) -> list[str]:
    """The literal strings `nodes` end with, in order."""
    texts: list[str] = []
    for node in reversed(nodes):
        if (text := _text(node)) is None:
            break
        texts.append(text)
    return texts[::-1]


def _divided(node: ast.expr) -> list[str]:
    """The literal strings a chain of `/` ends with, in order."""
    parts: list[str] = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        if (text := _text(node.right)) is None:
            break
        parts.append(text)
        node = node.left
    return parts[::-1]


def _path_like(text: str) -> bool:
    """A literal that may name a file beside the module: short, one line, relative."""
    return 0 < len(text) < 1024 and not any(c in text for c in "\n\0") and text[0] not in "/~"


def _module_files(folder: Path, name: str) -> list[str]:
    """The files of module `name` in `folder`, as Python finds it there: a package folder
    (with __init__.py) first, whole, else `name.py`; none for a name the folder does not hold."""
    package = folder / name
    if (package / "__init__.py").is_file():
        return sorted(
            path.relative_to(folder).as_posix()
            for path in package.rglob("*.py")
            if path.is_file() and not hidden(path.relative_to(package).parts)
        )
    return [f"{name}.py"] if (folder / f"{name}.py").is_file() else []


def hidden(parts: Sequence[str]) -> bool:
    """Editor and OS litter (.DS_Store, .ipynb_checkpoints, __pycache__): never shipped."""
    return any(part.startswith(".") or part == "__pycache__" for part in parts)


@dataclass(frozen=True)
class _Namespace:
    """One function's package: where its files are, the folder they are shown in, and the
    top-level names its modules' imports route into it."""

    package: str
    folder: Path
    shown: Path
    names: frozenset[str]
    scope: dict[str, Any]  # the modules' __builtins__: Python's, with the routing __import__

    def spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """The spec of `package.a.b`: `a/b/__init__.py` or `a/b.py` under `folder`."""
        parts = fullname.split(".")[1:]
        if not parts:  # the package itself: holds only what the finder gives it
            return importlib.machinery.ModuleSpec(fullname, None, is_package=True)
        if parts[0] not in self.names:
            return None
        base = self.folder.joinpath(*parts)
        file = base / "__init__.py"
        if not file.is_file():
            file = base.parent / f"{base.name}.py"
        if not file.is_file():
            return None
        shown = self.shown / file.relative_to(self.folder)
        loader = _SourceOnly(fullname, str(file), str(shown), self.scope)
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def _router(package: str, names: frozenset[str]) -> Callable[..., ModuleType]:
    """`__import__` for a function's modules: their own names from `package`, the rest as
    Python imports them (`importlib` itself as `_Importlib`, which routes the same way)."""
    routed = _Importlib(package, names)

    def __import__(
        name: str,
        globals: dict[str, Any] | None = None,
        locals: dict[str, Any] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> ModuleType:
        top = name.partition(".")[0]
        if level or top not in names:
            module = builtins.__import__(name, globals, locals, fromlist or (), level)
            # `import importlib(.util)`, `from importlib import import_module`
            return routed if not level and top == "importlib" and module is importlib else module
        module = builtins.__import__(f"{package}.{name}", globals, locals, fromlist or (), 0)
        return module if fromlist else sys.modules[f"{package}.{top}"]

    return __import__


class _Importlib(ModuleType):
    """`importlib` as a function's modules see it: its `import_module` of one of their own
    names (`"helpers.geo"`) imports it from their package, as an `import` statement does;
    everything else is importlib's."""

    def __init__(self, package: str, names: frozenset[str]) -> None:
        super().__init__("importlib", importlib.__doc__)
        self._package, self._names = package, names

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib, attribute)

    def import_module(self, name: str, package: str | None = None) -> ModuleType:
        if name.partition(".")[0] in self._names:  # a relative name starts with "."
            return importlib.import_module(f"{self._package}.{name}")
        return importlib.import_module(name, package)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of every function's package, and nothing else."""

    def __init__(self) -> None:
        self.spaces: dict[str, _Namespace] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        space = self.spaces.get(fullname.partition(".")[0])
        return None if space is None else space.spec(fullname)


class _SourceOnly(importlib.machinery.SourceFileLoader):
    """Compiles the verified source on every import and reads or writes no bytecode cache: a
    .pyc beside the handler is not covered by the bundle's content hash. The code is compiled
    under the name the user knows (their source file), so tracebacks point there; the module
    gets its function's `__builtins__` (the routing `__import__`) before it runs."""

    def __init__(self, fullname: str, path: str, shown: str, scope: dict[str, Any]) -> None:
        super().__init__(fullname, path)
        self.shown = shown
        self.scope = scope

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        _SHOWN.add(self.shown)
        return self.source_to_code(self.get_data(path), self.shown)

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = self.scope
        super().exec_module(module)


_SHOWN: set[str] = set()
_PARSED: dict[bytes, _Source] = {}
_FINDER = _Finder()
_PACKAGE_NAME = re.compile(PACKAGE + r"[0-9a-f]{16}\.")
