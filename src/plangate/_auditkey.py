"""Where the audit key comes from: outside the database, so whoever can write the database cannot forge the chain.

In order: ``PLANGATE_AUDIT_KEY`` (the key itself, at least 32 characters); else the key
file ``PLANGATE_AUDIT_KEY_FILE``, by default ``$XDG_CONFIG_HOME/plangate/audit.key``
(``~/.config/plangate/audit.key``), made on first use with 32 random bytes in hex, mode
0600, in a folder made 0700. A key file that others may read or write, or that is not a
regular file, is refused. The key is the text itself, white space around it ignored, so
``PLANGATE_AUDIT_KEY="$(cat audit.key)"`` is the same key as the file.
"""

from __future__ import annotations

import functools
import os
import secrets
import stat
import tempfile
from pathlib import Path

from plangate.errors import UsageError

KEY_VARIABLE = "PLANGATE_AUDIT_KEY"
FILE_VARIABLE = "PLANGATE_AUDIT_KEY_FILE"
MIN_LENGTH = 32
_MAKE_ONE = "python -c 'import secrets; print(secrets.token_hex(32))'"


def key_path() -> Path:
    """The key file this process would use (whether or not it exists)."""
    if named := os.environ.get(FILE_VARIABLE):
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"  # relative values are ignored (XDG)
    return base / "plangate" / "audit.key"


def find_audit_key() -> bytes | None:
    """This process's audit key, or None when none is set and the key file does not exist."""
    if value := os.environ.get(KEY_VARIABLE, "").strip():
        return _checked(value, KEY_VARIABLE)
    path = key_path()
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read the audit key file {path}: {exc.strerror}") from None
    return _read(path, (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, info.st_mode))


def audit_key() -> bytes:
    """This process's audit key, making the key file on first use."""
    key = find_audit_key()
    if key is None:
        _create(path := key_path())
        key = find_audit_key()
        if key is None:
            raise UsageError(f"the audit key file {path} was made but cannot be found; set {KEY_VARIABLE}")
    return key


@functools.lru_cache(maxsize=16)
def _read(path: Path, identity: tuple[int, ...]) -> bytes:
    """The key in ``path``; cached by the file's identity, so a changed, replaced or chmod-ed file is read again."""
    del identity  # only the cache's key
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block us
    except OSError as exc:
        raise UsageError(f"cannot read the audit key file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"the audit key file {path} is not a regular file")
        if info.st_mode & 0o077:
            mode = stat.S_IMODE(info.st_mode)
            raise UsageError(
                f"the audit key file {path} may be read or written by others (mode {mode:04o}): chmod 600 {path}"
            )
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", errors="replace").strip()
    return _checked(text, f"the audit key file {path}")


def _checked(text: str, where: str) -> bytes:
    if len(text) < MIN_LENGTH:
        raise UsageError(
            f"{where} holds a key of {len(text)} characters; an audit key needs at least {MIN_LENGTH} "
            f"(make one with: {_MAKE_ONE})"
        )
    return text.encode()


def _create(path: Path) -> None:
    """Write a new random key to ``path`` atomically; if another process got there first, keep theirs."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".audit.key.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex(32) + "\n")
                file.flush()
                os.fsync(file.fileno())
            os.link(temporary, path)  # never replaces an existing key
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
        _sync_folder(path.parent)
    except OSError as exc:
        raise UsageError(
            f"cannot make the audit key file {path}: {exc.strerror}; set {KEY_VARIABLE} or {FILE_VARIABLE}"
        ) from None


def _sync_folder(folder: Path) -> None:
    """Make the new file's name durable: a log whose key is lost can never be verified again."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
