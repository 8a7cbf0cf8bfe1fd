"""The export's manifest: the SHA-256 of every file, and the audit head the export was taken at; and its check.

``verify`` needs only the folder: each file listed must be there with its hash, and no
file may be there that is not listed. Given the store, it also checks that the audit
head the manifest names is in the store's log with that hash (the export was taken from
this log, and the log has not been rewritten since).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plangate.errors import UsageError
from plangate.store import Store

MANIFEST = "manifest.json"
FORMAT = 1


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def plain(name: str) -> bool:
    """Whether ``name`` names a file inside the folder: relative, no ``.`` or ``..`` or empty part, no backslash."""
    parts = name.split("/")
    return bool(name) and "\\" not in name and "\0" not in name and all(p not in ("", ".", "..") for p in parts)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: a key given twice reads one way to a person, another to json."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r} is given twice")
        found[key] = value
    return found


def files_in(folder: Path) -> list[str]:
    """Every file under ``folder`` but the manifest, as relative POSIX paths, sorted."""
    found = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()]
    return sorted(name for name in found if name != MANIFEST)


def write(folder: Path, meta: dict[str, Any]) -> str:
    """Write the manifest of every file now in ``folder``; its own SHA-256 (to keep elsewhere)."""
    manifest = {"format": FORMAT, **meta, "files": {name: sha256(folder / name) for name in files_in(folder)}}
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return sha256(path)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What :func:`verify` found: ``problem`` names the first file that does not fit (None: all fit)."""

    files: int
    manifest_sha256: str
    audit_head: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def __str__(self) -> str:
        if self.problem is not None:
            return f"export does not verify: {self.problem}"
        return (
            f"ok: {self.files} files match the manifest (sha256 {self.manifest_sha256}), audit head {self.audit_head}"
        )


def verify(folder: Path, store: Store | None = None, *, manifest_sha256: str | None = None) -> Verdict:
    """Check an export folder against its manifest (and, given ``store``, its audit head against the store).

    ``manifest_sha256``: the manifest's digest as the export printed it, kept elsewhere; a
    manifest rewritten to match changed files then no longer verifies.
    """
    manifest = _read(folder)
    listed: dict[str, str] = manifest["files"]
    head = manifest["audit_head"]
    verdict = Verdict(
        files=len(listed), manifest_sha256=sha256(folder / MANIFEST), audit_head=f"{head['seq']}:{head['hash']}"
    )
    problem = (
        _manifest_problem(verdict.manifest_sha256, manifest_sha256)
        or _files_problem(folder, listed)
        or (_head_problem(store, head) if store is not None else None)
    )
    return Verdict(**{**verdict.__dict__, "problem": problem})


def _manifest_problem(actual: str, expected: str | None) -> str | None:
    if expected is None or actual == expected.strip().lower():
        return None
    return f"{MANIFEST}: its SHA-256 is {actual}, not the {expected.strip()} kept from the export"


def _read(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder")
    path = folder / MANIFEST
    if not path.is_file():
        raise UsageError(f"{folder} holds no {MANIFEST}: not a governance export")
    try:
        manifest = json.loads(path.read_text(), object_pairs_hook=_unique)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    ok = isinstance(manifest, dict) and manifest.get("format") == FORMAT and isinstance(manifest.get("files"), dict)
    head = manifest.get("audit_head") if ok else None
    if not ok or not isinstance(head, dict) or not isinstance(head.get("seq"), int) or "hash" not in head:
        raise UsageError(f"{path} is not a manifest of format {FORMAT} (files, audit_head)")
    found: dict[str, Any] = manifest
    return found


def _files_problem(folder: Path, listed: dict[str, str]) -> str | None:
    present = set(files_in(folder))
    for name in sorted(listed.keys() | present):
        if name not in present:
            return f"{name}: missing (the manifest lists it)"
        if name not in listed:
            return f"{name}: extra file (the manifest does not list it)"
        path = folder / name
        if path.is_symlink():
            return f"{name}: a link, not a file"
        actual = sha256(path)
        if actual != listed[name]:
            return f"{name}: changed (sha256 {actual}, the manifest says {listed[name]})"
    return None


def _head_problem(store: Store, head: dict[str, Any]) -> str | None:
    seq, digest = head["seq"], head["hash"]
    now, _ = store.audit_head()
    if seq == 0:
        return None
    if seq > now:
        return f"{MANIFEST}: audit head {seq} is past the store's head {now}: not exported from this store"
    rows = store.query("SELECT hash FROM events WHERE seq = ?", (seq,))
    if not rows or rows[0][0] != digest:
        found = rows[0][0] if rows else "no such event"
        return f"{MANIFEST}: audit head {seq}:{digest} is not in the store's log (event {seq}: {found})"
    return None
