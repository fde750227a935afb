"""What a ``package.module:function`` model is made of, so that its prepare cache key changes
when the model does.

The key is computed before anything is loaded (a cache hit must cost no export), so this reads
files and never runs the factory. `factory_files` collects:

* the defining module's source file;
* the first-party modules it imports, transitively (found by parsing the imports, not by
  executing them), since a model class often lives beside its factory: a file outside the
  standard library and site-packages counts as first-party;
* data files those sources name in string literals (``torch.load("weights.pt")``,
  ``Path(__file__).parent / "model.safetensors"``), when such a file exists relative to the
  source's directory or the working directory: the weights that define the model.

Not covered: code executed from other places at run time (plugins, ``exec``) and files whose
names are computed (environment variables, f-strings, downloads). Change the spec or pass
``--force`` for those.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import sys
import sysconfig
from pathlib import Path

from qnn_common.store.hashing import sha256_file

# Enough for any real model package; a bound so a pathological import graph cannot stall a key.
_MAX_FILES = 500
_MAX_LITERAL = 1024


def factory_digest(spec: str) -> str:
    """sha256 over `spec` and the path and content digest of every file in `factory_files`."""
    h = hashlib.sha256(spec.encode())
    module_name = spec.split(":", 1)[0]
    for f in factory_files(module_name):
        h.update(b"\0" + str(f).encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()


def factory_files(module_name: str) -> list[Path]:
    """The files a factory module's model is made of (see the module doc), sorted; empty when
    the module cannot be found (prepare then reports why it cannot import it)."""
    start = _locate(module_name)
    if start is None:
        return []
    sources: dict[Path, str] = {}
    data: set[Path] = set()
    queue: list[tuple[str, Path]] = [(module_name, start)]
    # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
    for parent in _parents(module_name):
        found = _locate(parent)
        if found is not None:
            queue.append((parent, found))
    while queue and len(sources) + len(data) < _MAX_FILES:
        name, path = queue.pop()
        if path in sources:
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (OSError, SyntaxError, ValueError):
            sources[path] = name  # digested as bytes all the same; import reports the error
            continue
        sources[path] = name
        is_package = path.name == "__init__.py"
        for imported in _imported_names(tree, name, is_package):
            found = _locate(imported)
            if found is not None and found not in sources:
                queue.append((imported, found))
        data.update(_named_files(tree, path.parent))
    return sorted({*sources, *data})


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules `tree` (module `module`) imports, candidates included:
    ``from a import b`` yields both ``a`` and ``a.b`` (b may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name(
                    "." * node.level + (node.module or ""), package or None
                )
            except (ImportError, ValueError):
                continue
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return {parent for name in names for parent in (*_parents(name), name)}


def _parents(module_name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = module_name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _named_files(tree: ast.AST, directory: Path) -> set[Path]:
    """Existing files named by string literals in `tree`, relative to `directory` or the
    working directory (or absolute)."""
    found: set[Path] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        text = node.value
        if not text or len(text) > _MAX_LITERAL or "\n" in text or "\0" in text:
            continue
        for base in (directory, Path.cwd()):
            try:
                candidate = (base / text).resolve()
                if candidate.is_file():
                    found.add(candidate)
            except (OSError, ValueError):
                continue
    return found


def _locate(module_name: str) -> Path | None:
    """The first-party .py file of `module_name`, or None (not found, not a module, not
    source, or third-party). Searched like the import system's path finder, without importing
    anything (importlib.util.find_spec would run the parent packages)."""
    loaded = sys.modules.get(module_name)
    origin: str | None = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is None:
        search: list[str] | None = None  # sys.path
        spec = None
        for i, part in enumerate(module_name.split(".")):
            if i and search is None:
                return None  # the parent is a module, so this is an attribute of it
            try:
                spec = importlib.machinery.PathFinder.find_spec(part, search)
            except (ImportError, ValueError, OSError):
                return None
            if spec is None:
                return None
            locations = spec.submodule_search_locations
            search = list(locations) if locations is not None else None
        origin = getattr(spec, "origin", None)
    if not origin or not str(origin).endswith(".py"):
        return None
    path = Path(origin).resolve()
    return path if _first_party(path) else None


def _third_party_roots() -> tuple[Path, ...]:
    roots = set()
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            if key in paths:
                roots.add(Path(paths[key]).resolve())
    return tuple(roots)


_THIRD_PARTY = _third_party_roots()


def _first_party(path: Path) -> bool:
    if any(part in ("site-packages", "dist-packages") for part in path.parts):
        return False
    return not any(path.is_relative_to(root) for root in _THIRD_PARTY)
