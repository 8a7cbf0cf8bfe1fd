"""The catalogue: the set of tools a plan may use."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from plangate.errors import CatalogueError
from plangate.tools._tool import Tool, tool


class Catalogue:
    """Tools by name. Build it from tools (or plain typed functions) or load it from a module."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            entry = item if isinstance(item, Tool) else tool(item)
            if entry.name in self._tools:
                raise CatalogueError(f"two tools are named {entry.name!r}")
            self._tools[entry.name] = entry
        for entry in self._tools.values():
            if entry.compensate is not None and entry.compensate not in self._tools:
                raise CatalogueError(
                    f"tool {entry.name!r} is undone by {entry.compensate!r}, which is not in the catalogue"
                )

    @classmethod
    def from_module(cls, module: str | Path | ModuleType) -> Catalogue:
        """Every tool defined in a module, given as an import path, a ``.py`` file or a module."""
        loaded = module if isinstance(module, ModuleType) else _import(module)
        seen: dict[int, Tool] = {}
        for value in vars(loaded).values():
            if isinstance(value, Tool):
                seen.setdefault(id(value), value)
        if not seen:
            named = f"module {loaded.__name__!r}" if isinstance(module, ModuleType) else _named(module)
            raise CatalogueError(f"{named} defines no tools (decorate functions with @tool)")
        return cls(seen.values())

    def __getitem__(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"no tool named {name!r}") from None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def fingerprint(self, names: Iterable[str]) -> str:
        """SHA-256 over the named tools' contracts (unknown names count as absent)."""
        parts = sorted(f"{n}={self._tools[n].fingerprint if n in self._tools else '-'}" for n in set(names))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def describe(self) -> list[dict[str, Any]]:
        return [t.describe() for t in self]

    def __repr__(self) -> str:
        return f"Catalogue({', '.join(self._tools)})"


def _named(spec: str | Path) -> str:
    """The module as the person gave it: a file by its path, else a module by its import name."""
    text = str(spec)
    return f"tools file {text!r}" if text.endswith(".py") or "/" in text or "\\" in text else f"tools module {text!r}"


def _import(spec: str | Path) -> ModuleType:
    text = str(spec)
    if text.endswith(".py") or "/" in text or "\\" in text:
        return _import_file(Path(text))
    try:
        return importlib.import_module(text)
    except ImportError as exc:
        raise CatalogueError(f"cannot import tools module {text!r}: {exc}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - its own code failed (or tried to end plangate): say so
        raise CatalogueError(f"tools module {text!r} failed while importing: {type(exc).__name__}: {exc}") from None


def _import_file(path: Path) -> ModuleType:
    try:
        found = path.is_file()
    except OSError as exc:  # not a missing file (that is False): a name too long, a folder that may not be read
        raise CatalogueError(f"cannot read tools file {str(path)!r}: {exc.strerror or exc}") from None
    if not found:
        raise CatalogueError(f"tools file {str(path)!r} does not exist")
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = f"plangate_tools_{resolved.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise CatalogueError(f"cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - its own code failed (or tried to end plangate): say so
        del sys.modules[name]
        raise CatalogueError(f"tools file {str(path)!r} failed while importing: {type(exc).__name__}: {exc}") from None
    return module
