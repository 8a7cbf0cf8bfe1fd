"""Two plangate trees measured side by side: the same command in alternating processes, each with one tree's
``src`` folder on its path, so that both see the same (shared, noisy) machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

THIS = str(Path(__file__).resolve().parents[1] / "src")
"""This tree's ``src`` folder."""


def alternating(previous: str, rounds: int, command: list[str]) -> dict[str, list[list[str]]]:
    """The words ``command`` printed, by tree (``previous``, then ``this``), one list per process, over ``rounds``
    rounds of one process of each tree in turn."""
    printed: dict[str, list[list[str]]] = {"previous": [], "this": []}
    for _ in range(rounds):
        for label, src in (("previous", previous), ("this", THIS)):
            env = {**os.environ, "PYTHONPATH": src}
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            printed[label].append(done.stdout.split())
    return printed
