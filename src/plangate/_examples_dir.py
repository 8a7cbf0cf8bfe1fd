"""Where the bundled example business lives: inside the installed package, or in a checkout.

The files are kept once, in the repository's ``examples/`` folder; the build maps that
folder into the wheel as ``plangate._examples`` (see pyproject.toml).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from plangate.errors import UsageError

__all__ = ["examples_dir"]


def examples_dir() -> Path:
    """The folder holding ``business.py``, ``policy.yaml`` and ``plans/``."""
    spec = importlib.util.find_spec("plangate._examples")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    checkout = Path(__file__).resolve().parents[2] / "examples"  # running from a source checkout
    if (checkout / "business.py").is_file():
        return checkout
    raise UsageError("the bundled example is missing from this installation: reinstall plangate")
