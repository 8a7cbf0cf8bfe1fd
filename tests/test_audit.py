"""The keyed audit chain, attacked: what someone who can write the database, but has no key, can do unseen."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import stat
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner

from plangate import audit
from plangate._auditkey import audit_key, key_path
from plangate.cli import main
from plangate.errors import StoreError, UsageError
from plangate.plan import canonical
from plangate.store import Store, open_store

KEY = "the key this log was written with, 32+ characters"
OTHER_KEY = "another key altogether, also 32+ characters long"
_NAMES = itertools.count()


@pytest.fixture
def url(any_db: str) -> str:
    return any_db


def append(store: Store, count: int, *, first: int = 1) -> None:
    """``count`` events, in two transactions (the second finds the key id the first recorded)."""
    for numbers in (range(first, first + count // 2), range(first + count // 2, first + count)):
        with store.transaction():
            for n in numbers:
                store.append_event(
                    plan_id="plan-1",
                    version=1,
                    step_id=n,
                    kind="step.succeeded",
                    actor="engine",
                    at=f"2026-11-29T09:00:{n:02d}Z",
                    data={"output": {"refund_id": f"r-{n}", "amount": 10.0 * n}},
                )


def log(url: str, count: int = 10) -> tuple[int, str]:
    """A log of ``count`` events; its head."""
    with closing(open_store(url)) as store:
        append(store, count)
        return store.audit_head()


def verify(url: str, anchor: tuple[int, str] | None = None) -> audit.AuditReport:
    with closing(open_store(url)) as store:
        return store.verify_audit(anchor)


def tamper(url: str, *commands: tuple[str, tuple[object, ...]]) -> None:
    """Write the database directly, as anyone with access to it can."""
    with closing(open_store(url)) as store, store.transaction():
        for sql, params in commands:
            store.command(sql, params)


def unkeyed_hash(row: tuple[object, ...], prev: str) -> str:
    """An event's hash as plangate made it before the chain was keyed: what anyone can compute."""
    seq, plan_id, version, step_id, kind, actor, at, data = row
    header = {
        "seq": seq,
        "plan_id": plan_id,
        "version": version,
        "step_id": step_id,
        "kind": kind,
        "actor": actor,
        "at": at,
        "prev": prev,
    }
    return hashlib.sha256(f"{canonical(header)}\n{data}".encode()).hexdigest()


def rechain(url: str, start: int) -> None:
    """Recompute every hash from event ``start`` on, and the head, exactly as the unkeyed code did."""
    with closing(open_store(url)) as store:
        rows = store.query(
            "SELECT seq, plan_id, version, step_id, kind, actor, at, data, hash FROM events ORDER BY seq"
        )
        prev, updates = audit.GENESIS, []
        for row in rows:
            digest = unkeyed_hash(row[:8], prev) if row[0] >= start else row[8]
            updates.append(("UPDATE events SET prev = ?, hash = ? WHERE seq = ?", (prev, digest, row[0])))
            prev = digest
    tamper(url, *updates, ("UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", (rows[-1][0], prev)))


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PLANGATE_AUDIT_KEY", KEY)
    return KEY


def test_an_appended_event_is_hashed_by_the_documented_formula(url: str, key: str) -> None:
    """Pinned: the data as canonical JSON, its SHA-256, and the HMAC over a header and that digest.

    Logs written before must keep verifying: the formula does not change without a migration.
    """
    with closing(open_store(url)) as store:
        append(store, 4)
        rows = store.query(f"SELECT {audit.COLUMNS} FROM events ORDER BY seq")
    for row in rows:
        data = {"output": {"refund_id": f"r-{row[3]}", "amount": 10.0 * row[3]}}
        assert row[7] == json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert row[11] == hashlib.sha256(row[7].encode()).hexdigest()
        header = json.dumps([*row[:7], row[8], row[10]], separators=(",", ":"), ensure_ascii=False)
        expected = hmac.new(audit_key(), f"2\n{header}\n{row[11]}".encode(), hashlib.sha256).hexdigest()
        assert row[9] == expected


def test_recorded_events_are_written_in_order_before_anything_in_the_transaction_reads_the_log(
    url: str, key: str
) -> None:
    """record_event waits for the commit, or for the first statement that needs the log: same chain, same order."""

    def event(kind: str, step_id: int | None = None) -> dict[str, object]:
        return {
            "plan_id": "plan-1",
            "version": 1,
            "step_id": step_id,
            "kind": kind,
            "actor": "t",
            "at": "x",
            "data": {},
        }

    with closing(open_store(url)) as store:
        with store.transaction():
            store.record_event(**event("a"))  # type: ignore[arg-type]
            store.record_event(**event("b", 1))  # type: ignore[arg-type]
            assert [e.kind for e in store.events("plan-1")] == ["a", "b"]  # a read of the log sees them
            store.record_event(**event("c"))  # type: ignore[arg-type]
            appended = store.append_event(**event("d"))  # type: ignore[arg-type]
        with store.transaction():
            store.record_event(**event("e"))  # type: ignore[arg-type]
            store.record_event(**event("f"))  # type: ignore[arg-type]
        with pytest.raises(RuntimeError), store.transaction():
            store.record_event(**event("never"))  # type: ignore[arg-type]
            raise RuntimeError("rolled back")
        events = list(store.events("plan-1"))
        assert [(e.seq, e.kind) for e in events] == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"), (6, "f")]
        assert (appended.seq, appended.hash, appended.prev) == (4, events[3].hash, events[2].hash)
        assert store.audit_head() == (6, events[-1].hash)
        assert store.verify_audit().ok
        assert store.plan_events("plan-1") == (events, None)


# -- (a) an edit, with the chain and the head recomputed as the unkeyed code did ----------------------------


def test_an_edit_with_the_whole_chain_recomputed_is_caught(url: str, key: str) -> None:
    log(url)
    forged = canonical({"output": {"refund_id": "r-4", "amount": 4000.0}})
    tamper(url, ("UPDATE events SET data = ? WHERE seq = 4", (forged,)))
    rechain(url, start=4)
    report = verify(url)
    assert not report.ok and report.bad_seq == 4, report
    assert report.problem == "its content does not match its hash (step.succeeded for plan plan-1): it was edited"
    code, out, _ = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith("audit log BROKEN at event 4: its content does not match its hash")


def test_a_log_rewritten_whole_and_its_key_id_deleted_is_not_taken_for_intact(url: str, key: str) -> None:
    log(url)
    tamper(url, ("DELETE FROM settings WHERE key = ?", (audit.KEY_ID,)))
    rechain(url, start=1)
    report = verify(url)
    assert not report.ok and report.bad_seq is None and report.problem == audit.UNKEYED
    assert report.events == 10
    code, out, _ = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith("audit log NOT VERIFIED: the audit log has events but no key id")
    with closing(open_store(url)) as store, pytest.raises(StoreError, match="no key id"):
        append(store, 2, first=11)


def test_an_edit_of_the_stored_text_that_keeps_its_meaning_is_caught(url: str, key: str) -> None:
    log(url, 4)
    tamper(url, ("UPDATE events SET data = ? WHERE seq = 2", ('{"output": {"amount": 20.0, "refund_id": "r-2"}}',)))
    report = verify(url)
    assert not report.ok and report.bad_seq == 2 and "it was edited" in (report.problem or "")


# -- (b) another key ------------------------------------------------------------------------------------


def test_another_key_is_told_plainly_and_may_not_append(url: str, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    head = log(url)
    monkeypatch.setenv("PLANGATE_AUDIT_KEY", OTHER_KEY)
    written, this = audit.key_id(KEY.encode()), audit.key_id(OTHER_KEY.encode())
    message = (
        f"the audit log was written with another key (key id {written}; this process has {this}): "
        "set PLANGATE_AUDIT_KEY or PLANGATE_AUDIT_KEY_FILE to the key it was written with"
    )
    report = verify(url)
    assert not report.ok and report.bad_seq is None and report.problem == message
    assert (report.events, report.head_seq, report.head_hash) == (10, *head)
    code, out, _ = cli("audit", "verify", "--db", url)
    assert code == 1 and out.strip() == f"audit log NOT VERIFIED: {message}"
    with closing(open_store(url)) as store:
        with pytest.raises(StoreError) as refused:
            append(store, 2, first=11)
        assert str(refused.value) == message
        assert store.audit_head() == head, "nothing was appended"
    monkeypatch.setenv("PLANGATE_AUDIT_KEY", KEY)
    assert str(verify(url)) == f"audit log intact: 10 events, head {head[0]} {head[1]}, key id {written}"


def test_no_key_at_all_is_told_plainly(url: str, key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log(url, 2)
    monkeypatch.delenv("PLANGATE_AUDIT_KEY")
    monkeypatch.setenv("PLANGATE_AUDIT_KEY_FILE", str(tmp_path / "missing.key"))
    report = verify(url)
    assert not report.ok and "this process has no audit key" in (report.problem or "")
    assert str(tmp_path / "missing.key") in (report.problem or "")
    assert not (tmp_path / "missing.key").exists(), "verifying makes no key"


# -- (c) truncation with the head rewritten ------------------------------------------------------------


def test_a_cut_off_end_with_the_head_rewritten_is_caught_by_an_anchored_head(url: str, key: str) -> None:
    anchored = log(url)
    code, out, _ = cli("audit", "head", "--db", url)
    assert code == 0 and out == f"{anchored[0]} {anchored[1]}\n"
    with closing(open_store(url)) as store:
        (hash7,) = store.query("SELECT hash FROM events WHERE seq = 7")[0]
    tamper(
        url,
        ("DELETE FROM events WHERE seq > 7", ()),
        ("UPDATE audit_head SET seq = 7, hash = ? WHERE id = 1", (hash7,)),
    )
    assert verify(url).ok, "the log alone cannot tell a cut-off end whose head was rewritten"
    report = verify(url, anchored)
    assert not report.ok and report.bad_seq == 8
    assert report.problem == "the log ends at event 7 but the anchored head is event 10: events were cut off the end"
    code, out, _ = cli("audit", "verify", "--db", url, "--head", f"{anchored[0]}:{anchored[1]}")
    assert code == 1 and out.startswith("audit log BROKEN at event 8: the log ends at event 7")
    code, out, _ = cli("audit", "verify", "--db", url, "--head", f"7 {hash7}")  # as `audit head` prints it
    # the chain holds that head; the command also holds the tables against the log, and these
    # synthetic events name a plan that has no row
    assert code == 1 and out.startswith("audit log intact, but") and "row in plans does not" in out, out


def test_an_anchor_the_log_does_not_extend_names_the_event(url: str, key: str) -> None:
    head = log(url, 4)
    report = verify(url, (3, "f" * 64))
    assert not report.ok and report.bad_seq == 3
    assert report.problem is not None and "but the anchored head says ffffffffffffffff..." in report.problem
    assert verify(url, head).ok and verify(url, (0, audit.GENESIS)).ok


def test_a_head_that_is_not_seq_colon_hash_is_refused(tmp_path: Path) -> None:
    code, _, err = cli("audit", "verify", "--db", f"sqlite:///{tmp_path}/p.db", "--head", "10:abc")
    assert code == 2 and "'10:abc' is not SEQ:HASH" in err
    code, out, _ = cli("audit", "head", "--db", f"sqlite:///{tmp_path}/p.db", "--json")
    assert code == 0 and out.strip() == f'{{"seq": 0, "hash": "{audit.GENESIS}"}}'


# -- (d), (e) the key file --------------------------------------------------------------------------------


def test_a_key_file_others_may_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "audit.key"
    path.write_text("0123456789abcdef" * 4 + "\n")
    monkeypatch.setenv("PLANGATE_AUDIT_KEY_FILE", str(path))
    for mode in (0o644, 0o640, 0o604, 0o620):
        path.chmod(mode)
        with pytest.raises(UsageError, match=rf"may be read or written by others \(mode {mode:04o}\): chmod 600"):
            audit_key()
    url = f"sqlite:///{tmp_path}/p.db"
    code, _, err = cli("audit", "verify", "--db", url)
    assert code == 0, "an empty log needs no key"
    path.chmod(0o600)
    log(url, 2)
    path.chmod(0o644)
    code, _, err = cli("audit", "verify", "--db", url)
    assert code == 2 and "may be read or written by others (mode 0644)" in err
    path.unlink()
    path.mkdir(mode=0o700)
    with pytest.raises(UsageError, match="is not a regular file"):
        audit_key()


def test_a_short_key_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANGATE_AUDIT_KEY", "too short")
    with pytest.raises(UsageError, match=r"PLANGATE_AUDIT_KEY holds a key of 9 characters; .* at least 32"):
        audit_key()
    monkeypatch.delenv("PLANGATE_AUDIT_KEY")
    monkeypatch.setenv("PLANGATE_AUDIT_KEY_FILE", str(tmp_path / "short.key"))
    (tmp_path / "short.key").write_text("abc\n")
    (tmp_path / "short.key").chmod(0o600)
    with pytest.raises(UsageError, match=r"short\.key holds a key of 3 characters"):
        audit_key()


def test_the_key_file_is_made_on_first_use_for_the_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLANGATE_AUDIT_KEY_FILE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/is/ignored")
    assert key_path() == tmp_path / "home" / ".config" / "plangate" / "audit.key"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "config" / "plangate" / "audit.key"
    assert key_path() == path and not path.exists()
    url = f"sqlite:///{tmp_path}/p.db"
    log(url, 2)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    text = path.read_text()
    assert len(text.strip()) == 64 and int(text, 16) and text.endswith("\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["audit.key"], "no temporary file left"
    with closing(open_store(url)) as store:
        assert store.query("SELECT value FROM settings WHERE key = ?", (audit.KEY_ID,)) == [
            (audit.key_id(text.strip().encode()),)
        ]
        append(store, 2, first=3)
    assert path.read_text() == text, "made once, then reused"
    monkeypatch.setenv("PLANGATE_AUDIT_KEY", text)  # the file's text, as $(cat audit.key) gives it
    path.unlink()
    assert verify(url).ok and not path.exists()


def test_a_rolled_back_first_append_records_the_key_id_again(tmp_path: Path, key: str) -> None:
    url = f"sqlite:///{tmp_path}/p.db"
    with closing(open_store(url)) as store:
        with pytest.raises(RuntimeError), store.transaction():
            append(store, 2)
            raise RuntimeError("the first transaction fails")
        assert store.query("SELECT value FROM settings WHERE key = ?", (audit.KEY_ID,)) == []
        append(store, 2)
        assert store.query("SELECT value FROM settings WHERE key = ?", (audit.KEY_ID,)) == [
            (audit.key_id(KEY.encode()),)
        ]
    assert verify(url).ok
