"""The body limit against a real server: a 256 MiB chunked body neither gets in nor grows the process."""

from __future__ import annotations

import contextlib
import http.client
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from plangate.accounts import Accounts
from plangate.store import open_store
from tests.conftest import EXAMPLES
from tests.serverkit import serving

MIB = 1 << 20
CHUNK = b"[" * (64 * 1024)


def memory(pid: int) -> dict[str, int]:
    """The process's resident memory now (VmRSS) and at its peak (VmHWM), in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, object]]:
    db = f"sqlite:///{tmp_path}/plangate.db"
    accounts = Accounts(open_store(db))
    accounts.add("alice", "requester")
    token = accounts.issue_token("alice")
    env = {"PLANGATE_DB": db, "PLANGATE_SLACK_SIGNING_SECRET": "a chat signing secret"}
    with serving(tmp_path, env, "--tools", str(EXAMPLES / "business.py")) as (url, process):
        yield {"port": int(url.rsplit(":", 1)[1]), "pid": process.pid, "token": token}


def post_chunked(port: int, path: str, megabytes: int, headers: dict[str, str]) -> int | None:
    """POST ``megabytes`` MiB in 64 KiB chunks; the reply's status, or None if the server hung up first."""

    def body() -> Iterator[bytes]:
        for _ in range(megabytes * MIB // len(CHUNK)):
            yield CHUNK

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    with contextlib.suppress(OSError):  # the server answered and closed while we were still sending
        connection.request(
            "POST", path, body=body(), headers={"Transfer-Encoding": "chunked", **headers}, encode_chunked=True
        )
    try:
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("path", "authorised", "expected"),
    [("/slack/actions", False, 413), ("/api/plans", False, 401), ("/api/plans", True, 413)],
)
def test_a_huge_chunked_body_is_refused_and_the_server_stays_small(
    server: dict[str, int], path: str, authorised: bool, expected: int
) -> None:
    pid, port = server["pid"], server["port"]
    before = memory(pid)
    headers = {"Content-Type": "application/x-www-form-urlencoded" if "slack" in path else "application/json"}
    if authorised:
        headers["Authorization"] = f"Bearer {server['token']}"
    status = post_chunked(port, path, 256, headers)
    after = memory(pid)
    assert status in (None, expected)
    assert after["VmRSS"] - before["VmRSS"] < 50 * MIB, (before, after)
    assert after["VmHWM"] - max(before["VmHWM"], before["VmRSS"]) < 50 * MIB, (before, after)
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=5).status == 200, "still serving"
