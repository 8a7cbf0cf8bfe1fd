"""Secret keys kept outside the database, so that whoever can write the database cannot forge with them.

plangate has two: the audit key, under which every event is chained (``PLANGATE_AUDIT_KEY``),
and the server's secret, which signs session cookies and CSRF tokens
(``PLANGATE_SECRET_KEY``). Each is found the same way, in order: the environment variable
(the key itself, at least 32 characters); else the key file named by ``..._FILE``, by
default ``$XDG_CONFIG_HOME/plangate/<name>.key`` (``~/.config/plangate/<name>.key``),
made on first use with 32 random bytes in hex, mode 0600, in a folder made 0700. A key
file that others may read or write, or that is not a regular file, is refused. The key
is the text itself, white space around it ignored, so ``PLANGATE_AUDIT_KEY="$(cat
audit.key)"`` is the same key as the file.
"""

from __future__ import annotations

import functools
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from plangate.errors import UsageError

MIN_LENGTH = 32
_MAKE_ONE = "python -c 'import secrets; print(secrets.token_hex(32))'"


def config_dir() -> Path:
    """plangate's folder in the user's configuration folder (``$XDG_CONFIG_HOME/plangate``)."""
    config = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(config) if os.path.isabs(config) else Path.home() / ".config"  # relative values are ignored (XDG)
    return base / "plangate"


@dataclass(frozen=True)
class KeySource:
    """Where one key comes from: an environment variable, else a private key file."""

    what: str  # "audit key"
    variable: str  # PLANGATE_AUDIT_KEY
    file_variable: str  # PLANGATE_AUDIT_KEY_FILE
    filename: str  # audit.key

    def path(self) -> Path:
        """The key file this process would use (whether or not it exists)."""
        if named := os.environ.get(self.file_variable):
            return Path(named).expanduser()
        return config_dir() / self.filename

    def find(self) -> bytes | None:
        """The key, or None when none is set and the key file does not exist."""
        if value := os.environ.get(self.variable, "").strip():
            return self._checked(value, self.variable)
        path = self.path()
        try:
            info = path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"cannot read the {self.what} file {path}: {exc.strerror}") from None
        text = _read(path, self.what, (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, info.st_mode))
        return self._checked(text, f"the {self.what} file {path}")

    def get(self) -> bytes:
        """The key, making the key file on first use."""
        key = self.find()
        if key is None:
            self._create(path := self.path())
            key = self.find()
            if key is None:
                raise UsageError(f"the {self.what} file {path} was made but cannot be found; set {self.variable}")
        return key

    def _checked(self, text: str, where: str) -> bytes:
        if len(text) < MIN_LENGTH:
            raise UsageError(
                f"{where} holds a key of {len(text)} characters; the {self.what} needs at least {MIN_LENGTH} "
                f"(make one with: {_MAKE_ONE})"
            )
        return text.encode()

    def _create(self, path: Path) -> None:
        """Write a new random key to ``path`` atomically; if another process got there first, keep theirs."""
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{self.filename}.")  # mode 0600
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
                f"cannot make the {self.what} file {path}: {exc.strerror}; set {self.variable} or {self.file_variable}"
            ) from None


@functools.lru_cache(maxsize=16)
def _read(path: Path, what: str, identity: tuple[int, ...]) -> str:
    """The text in ``path``; cached by the file's identity, so a changed, replaced or chmod-ed file is read again."""
    del identity  # only the cache's key
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block us
    except OSError as exc:
        raise UsageError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"the {what} file {path} is not a regular file")
        if info.st_mode & 0o077:
            mode = stat.S_IMODE(info.st_mode)
            raise UsageError(
                f"the {what} file {path} may be read or written by others (mode {mode:04o}): chmod 600 {path}"
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").strip()


def _sync_folder(folder: Path) -> None:
    """Make the new file's name durable: a log whose key is lost can never be verified again."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


AUDIT_KEY = KeySource("audit key", "PLANGATE_AUDIT_KEY", "PLANGATE_AUDIT_KEY_FILE", "audit.key")
SECRET_KEY = KeySource("secret key", "PLANGATE_SECRET_KEY", "PLANGATE_SECRET_KEY_FILE", "secret.key")
