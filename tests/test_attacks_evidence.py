"""Attacks on the evidence: retention purges, the governance export, replay, /metrics, compare and timeline pages.

Each test is an attack by someone who can write the database (or the files, or send requests)
but holds no audit key; each must fail safely, with a message naming the rule and the place.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from plangate import Catalogue, Policy, Runtime, _purged, metrics, notify
from plangate.accounts import Accounts
from plangate.cli import main
from plangate.errors import GovernanceError
from plangate.store import open_store
from tests import serverkit
from tests.helpers import plan
from tests.serverkit import api, browser
from tests.test_retention import events_of, plans, tamper


def cli(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout + result.stderr


@pytest.fixture
def old(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{tmp_path}/plangate.db"
    return url, plans(url, catalogue, policy)


# -- retention: forged purges -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"purged":{"at":"x","seal":"0"},"n":NaN}',  # parses, but cannot be re-serialised
        '{"purged":{"at":"x","seal":"0"},"n":' + "[" * 100_000 + "]" * 100_000 + "}",  # nested past the stack
        '{"purged":{"at":"x","seal":"0"},"n":1e999}',
        '{"purged":{"seal":"0"},"n":"\\ud800"}',  # a lone surrogate
        '{"purged":{"at":"x","seal":"\u00e9"}}',  # a seal that is not ASCII
    ],
    ids=["nan", "deep", "infinite", "surrogate", "non-ascii-seal"],
)
def test_a_purged_event_that_cannot_be_reserialised_is_reported_not_crashed_on(
    old: tuple[str, dict[str, str]], text: str
) -> None:
    url, ids = old
    seq = events_of(url, ids["done"])[1][0]
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", (text, seq))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {seq}: its content does not match"), out
    code, out = cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)
    assert code == 0 and f"left whole: plan {ids['done']}: its events do not verify" in out, out


def test_a_purged_event_switched_to_the_old_hash_form_is_caught(old: tuple[str, dict[str, str]]) -> None:
    """Downgrade: data_hash NULL makes the hash cover the data itself; the blanked data cannot match."""
    url, ids = old
    assert cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)[0] == 0
    row = next(r for r in events_of(url, ids["done"]) if "purged" in r[7])
    tamper(url, "UPDATE events SET data_hash = NULL WHERE seq = ?", (row[0],))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {row[0]}"), out


def test_a_new_event_switched_to_the_old_hash_form_with_its_data_changed_is_caught(
    old: tuple[str, dict[str, str]],
) -> None:
    url, ids = old
    seq, data = next((r[0], r[7]) for r in events_of(url, ids["done"]) if '"output"' in r[7])
    tamper(url, "UPDATE events SET data_hash = NULL, data = ? WHERE seq = ?", (data.replace("output", "outpvt"), seq))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {seq}"), out
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", (data, seq))  # the data as written, digest dropped
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {seq}"), out


def test_a_seal_from_another_seq_of_the_same_plan_is_caught(old: tuple[str, dict[str, str]]) -> None:
    url, ids = old
    assert cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)[0] == 0
    rows = [r for r in events_of(url, ids["done"]) if "purged" in r[7]]
    first, second = rows[0], rows[1]
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", (first[7], second[0]))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {second[0]}"), out


def test_a_purged_event_with_duplicate_keys_is_caught(old: tuple[str, dict[str, str]]) -> None:
    """A key repeated ahead of the kept one parses to the same data, but it is not the text the seal covers."""
    url, ids = old
    assert cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)[0] == 0
    seq, data = next((r[0], r[7]) for r in events_of(url, ids["done"]) if "purged" in r[7])
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", ('{"output":"forged",' + data[1:], seq))
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and out.startswith(f"audit log BROKEN at event {seq}"), out


# -- retention: a plan made to look purged ------------------------------------------------------


def fake_purge(url: str, plan_id: str) -> None:
    tamper(url, "UPDATE plans SET purged_at = ? WHERE id = ?", ("2020-02-01T00:00:00.000000Z", plan_id))
    tamper(url, "UPDATE plan_versions SET body = ? WHERE plan_id = ?", (_purged.body("2020-02-01"), plan_id))


def test_an_approved_plan_made_to_look_purged_does_not_run(
    old: tuple[str, dict[str, str]], catalogue: Catalogue, policy: Policy
) -> None:
    url, ids = old
    fake_purge(url, ids["approved"])
    with closing(Runtime(catalogue, policy, db=url)) as rt, pytest.raises(GovernanceError) as caught:
        rt.execute(ids["approved"])
    assert "purged_at" in str(caught.value) or "plan text" in str(caught.value), caught.value
    code, out = cli("audit", "verify", "--db", url)
    assert code == 1 and "purged_at" in out and ids["approved"] in out, out


def test_a_plan_made_to_look_purged_is_refused_by_show_and_replay_not_hidden(old: tuple[str, dict[str, str]]) -> None:
    url, ids = old
    fake_purge(url, ids["done"])
    why = f"plan {ids['done']}: plans.purged_at says its payloads were purged on 2020-02-01T00:00:00.000000Z"
    for command in ("show", "replay"):
        code, out = cli(command, ids["done"], "--db", url)
        assert code != 0 and why in out and "records no purge" in out and "payloads purged" not in out, out


@pytest.mark.parametrize("status", ["running", "halted", "approved", "pending_approval"])
def test_an_unfinished_plan_whose_status_is_faked_to_finished_is_left_whole(
    old: tuple[str, dict[str, str]], status: str
) -> None:
    url, ids = old
    target = ids["approved"] if status != "pending_approval" else ids["pending"]
    tamper(url, "UPDATE plans SET status = 'succeeded' WHERE id = ?", (target,))
    code, out = cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)
    assert code == 0 and f"left whole: plan {target}: its rows disagree with its events" in out, out
    with closing(open_store(url)) as store:
        assert store.get_plan(target).purged_at is None  # type: ignore[union-attr]


# -- retention: the floor -----------------------------------------------------------------------


@pytest.mark.parametrize("days", ["-1", "0", "89", "-100000", "99999999999", "1e3", "90.5", "0x100", " 365"])
def test_odd_limits_are_refused_with_one_line(old: tuple[str, dict[str, str]], days: str) -> None:
    url, _ = old
    before = events_of(url, None)  # type: ignore[arg-type]
    code, out = cli("retention", "purge", "--older-than", days, "--yes", "--db", url)
    if days.strip() == "365":
        assert code == 0, out
        return
    assert code == 2 and "Traceback" not in out and "older-than" in out.lower(), out
    assert events_of(url, None) == before  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tail", ["\u00b2:abc:def", "1:abc:\u00e9", "1:abc", ""], ids=["superscript", "accent", "short", "empty"]
)
def test_an_odd_tail_seal_is_refused_as_forged_not_crashed_on(
    old: tuple[str, dict[str, str]], catalogue: Catalogue, policy: Policy, tail: str
) -> None:
    url, ids = old
    tamper(url, "UPDATE plans SET tail = ? WHERE id = ?", (tail, ids["approved"]))
    with closing(Runtime(catalogue, policy, db=url)) as rt, pytest.raises(GovernanceError) as caught:
        rt.execute(ids["approved"])
    assert "the seal naming the plan's newest event is missing or was forged" in str(caught.value)


# -- retention: who may purge, and cutting the purge's record off the log ------------------------


def test_only_a_governance_account_may_purge_once_the_store_has_accounts(
    old: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, ids = old
    monkeypatch.setenv("PLANGATE_DB", url)
    password = "a long enough password 1"

    def add(name: str, role: str, *extra: str) -> None:
        code, out = cli("users", "add", name, "--role", role, "--password-stdin", *extra, stdin=password + "\n")
        assert code == 0, out

    def login(name: str) -> str:
        code, out = cli("login", name, "--password-stdin", "--print", stdin=password + "\n")
        assert code == 0, out
        return out.strip().splitlines()[-1]

    add("gina", "governance", "--category", "*")
    gina = login("gina")
    for name, role in (("alice", "requester"), ("carol", "approver"), ("audrey", "auditor")):
        extra = ("--category", "*") if role == "approver" else ()
        code, out = (
            CliRunner()
            .invoke(
                main,
                ["users", "add", name, "--role", role, "--password-stdin", *extra, "--token", gina],
                input=password + "\n",
            )
            .exit_code,
            "",
        )
        assert code == 0
    for who in (
        ["--as", "gina"],
        ["--token", login("alice")],
        ["--token", login("carol")],
        ["--token", login("audrey")],
    ):
        code, out = cli("retention", "purge", "--older-than", "100", "--yes", *who)
        assert code == 4 and "purged" not in out.replace("nothing was purged", ""), (who, out)
        with closing(open_store(url)) as store:
            assert store.get_plan(ids["done"]).purged_at is None  # type: ignore[union-attr]
    code, out = cli("retention", "purge", "--older-than", "100", "--yes", "--token", gina)
    assert code == 0 and "purged 2 plan(s)" in out, out


def test_cutting_the_purge_record_off_the_log_is_caught_by_an_anchored_head(old: tuple[str, dict[str, str]]) -> None:
    url, _ = old
    assert cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)[0] == 0
    code, out = cli("audit", "head", "--db", url)
    anchor = ":".join(out.split()[:2])
    with closing(open_store(url)) as store:
        (seq, _), *_ = store.query("SELECT seq, hash FROM events WHERE kind = 'retention.purged'")
        prev = store.query("SELECT seq, hash FROM events WHERE seq = ?", (seq - 1,))[0]
    tamper(url, "DELETE FROM events WHERE seq = ?", (seq,))
    tamper(url, "UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", (prev[0], prev[1]))
    code, out = cli("audit", "verify", "--db", url, "--head", anchor)
    assert code == 1 and "events were cut off the end" in out, out


# -- governance export and verify ---------------------------------------------------------------


def exported(url: str, out: Path) -> str:
    code, text = cli("governance", "export", "--out", str(out), "--db", url)
    assert code == 0, text
    return text


def rewrite_manifest(out: Path, change: Any) -> None:
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_export_force_never_deletes_what_a_planted_manifest_lists_outside_the_folder(
    old: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, _ = old
    out, victim = tmp_path / "export", tmp_path / "victim.txt"
    exported(url, out)
    victim.write_text("keep me")
    for name in ("../victim.txt", str(victim)):
        rewrite_manifest(out, lambda m, name=name: m["files"].__setitem__(name, "0" * 64))
        code, text = cli("governance", "export", "--out", str(out), "--force", "--db", url)
        assert code == 2 and f"its manifest lists {name!r}, which is not a file inside the folder" in text, text
        assert victim.read_text() == "keep me"
        rewrite_manifest(out, lambda m, name=name: m["files"].pop(name))


def test_export_force_removes_a_planted_link_not_what_it_points_at(
    old: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, _ = old
    out, victim = tmp_path / "export", tmp_path / "victim.txt"
    exported(url, out)
    victim.write_text("keep me")
    (out / "README.md").unlink()
    (out / "README.md").symlink_to(victim)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.txt").write_text("keep me too")
    (out / "traces").rename(tmp_path / "old-traces")
    (out / "traces").symlink_to(outside, target_is_directory=True)
    code, text = cli("governance", "export", "--out", str(out), "--force", "--db", url)
    assert code == 2 and "holds files that are not part of its export (such as traces)" in text, text
    assert victim.read_text() == "keep me" and (outside / "x.txt").read_text() == "keep me too", text


def test_verify_does_not_follow_a_link_out_of_the_folder(old: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, _ = old
    out, outside = tmp_path / "export", tmp_path / "elsewhere"
    exported(url, out)
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("not part of the export")
    (out / "more").symlink_to(outside, target_is_directory=True)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    rewrite_manifest(out, lambda m: m["files"].update({"more/secret.txt": digest, "more": digest}))
    code, text = cli("governance", "verify", str(out))
    assert code == 1 and "export does not verify: more" in text and "link" in text, text


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", "traces", "a/../README.md", "./README.md", ""])
def test_verify_refuses_a_manifest_naming_a_file_outside_or_odd(
    old: tuple[str, dict[str, str]], tmp_path: Path, name: str
) -> None:
    url, _ = old
    out = tmp_path / "export"
    exported(url, out)
    (tmp_path / "outside.txt").write_text("x")
    digest = hashlib.sha256(b"x").hexdigest()
    rewrite_manifest(out, lambda m: m["files"].__setitem__(name, digest))
    code, text = cli("governance", "verify", str(out))
    assert code == 1 and text.startswith(f"export does not verify: {name}: missing"), text
    assert text.count("\n") == 1, text


def test_verify_refuses_a_manifest_with_a_key_given_twice(old: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, _ = old
    out = tmp_path / "export"
    exported(url, out)
    path = out / "manifest.json"
    text = path.read_text()
    path.write_text(text.replace('"files": {', '"files": {"README.md": "' + "0" * 64 + '", ', 1))
    code, said = cli("governance", "verify", str(out))
    assert code == 2 and "README.md" in said and "twice" in said, said


def test_export_refuses_a_plan_id_that_would_write_outside_the_folder(
    old: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, ids = old
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as raw:  # foreign keys are off by default
        raw.execute("UPDATE plans SET id = ? WHERE id = ?", ("../../escaped", ids["rejected"]))
        raw.commit()
    out = tmp_path / "a" / "b" / "export"
    code, text = cli("governance", "export", "--out", str(out), "--db", url)
    assert not list(tmp_path.rglob("escaped*")), text
    assert code == 4 and "../../escaped" in text and "not a file inside --out" in text, text


@pytest.mark.parametrize("since", ["2020-13-01", "", "yesterday", "2020-01-01T00:00:00+99:00", "9" * 5000, "\x00"])
def test_odd_since_values_are_refused_in_one_line(old: tuple[str, dict[str, str]], tmp_path: Path, since: str) -> None:
    url, _ = old
    code, text = cli("governance", "export", "--out", str(tmp_path / "x"), "--since", since, "--db", url)
    assert code == 2 and "--since" in text and "Traceback" not in text, text


# -- replay -------------------------------------------------------------------------------------

RECORDING = """
import os

from plangate import tool


def _called(name: str) -> None:
    with open(os.environ["RECORDED_CALLS"], "a") as log:
        log.write(name + "\\n")


@tool
def read_thing(key: str) -> dict:
    _called("read_thing")
    return {"value": key}


@tool(effect="write")
def write_thing(value: str) -> dict:
    _called("write_thing")
    return {"ok": True}
"""


@pytest.fixture
def recorded_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, Path]:
    """A plan run with tools that write down each call."""
    module, calls = tmp_path / "recording.py", tmp_path / "calls.txt"
    module.write_text(RECORDING)
    monkeypatch.setenv("RECORDED_CALLS", str(calls))
    url = f"sqlite:///{tmp_path}/plangate.db"
    steps = (
        {"id": 1, "tool": "read_thing", "params": {"key": "k"}},
        {"id": 2, "tool": "write_thing", "params": {"value": "$1.value"}},
    )
    policy = Policy.from_yaml("version: 1\nname: p\n")
    with closing(Runtime(Catalogue.from_module(str(module)), policy, db=url, tools=str(module))) as rt:
        record = rt.submit(plan(*steps), "alice")
        rt.approve(record.id, "ben", record.hash)
        rt.execute(record.id)
    assert calls.read_text().split() == ["read_thing", "write_thing"]
    calls.unlink()
    return url, record.id, calls


def test_replay_calls_no_tool(recorded_run: tuple[str, str, Path], tmp_path: Path) -> None:
    url, plan_id, calls = recorded_run
    code, out = cli("replay", plan_id, "--db", url)
    assert code == 0, out
    changed = tmp_path / "policy.yaml"
    changed.write_text("version: 1\nname: p\ndeny:\n  - name: no-writes\n    tool: write_thing\n")
    code, out = cli("replay", plan_id, "--db", url, "--policy", str(changed))
    assert not calls.exists(), calls.read_text()


def test_replay_names_a_rewritten_row(recorded_run: tuple[str, str, Path]) -> None:
    url, plan_id, calls = recorded_run
    tamper(url, "UPDATE steps SET output = ? WHERE plan_id = ? AND step_id = 1", ('{"value":"forged"}', plan_id))
    code, out = cli("replay", plan_id, "--db", url)
    assert code == 1 and "stored rows" in out and "step 1" in out and not calls.exists(), out


def test_replay_refuses_a_plan_whose_events_do_not_verify(recorded_run: tuple[str, str, Path]) -> None:
    url, plan_id, calls = recorded_run
    with closing(open_store(url)) as store:
        seq, data = store.query("SELECT seq, data FROM events WHERE plan_id = ? AND data LIKE '%output%'", (plan_id,))[
            0
        ]
    tamper(url, "UPDATE events SET data = ? WHERE seq = ?", (data.replace('"k"', '"forged"'), seq))
    code, out = cli("replay", plan_id, "--db", url)
    assert code == 4 and f"plan {plan_id}'s audit events do not verify (event {seq}" in out, out
    assert not calls.exists()


@pytest.mark.parametrize(
    ("option", "text"),
    [
        ("--policy", "version: 1\nname: [unclosed\n"),
        ("--policy", "- just\n- a list\n"),
        ("--policy", "version: 1\nname: p\ndeny: 7\n"),
        ("--policy", "\x00\xff"),
        ("--tools", "this is not python("),
        ("--tools", "raise SystemExit(0)\n"),
        ("--tools", "x = 1\n"),
    ],
)
def test_replay_with_a_malformed_file_is_one_line_exit_2(
    recorded_run: tuple[str, str, Path], tmp_path: Path, option: str, text: str
) -> None:
    url, plan_id, calls = recorded_run
    path = tmp_path / ("bad.yaml" if option == "--policy" else "bad_tools.py")
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    code, out = cli("replay", plan_id, "--db", url, option, str(path))
    first = out.splitlines()[0]
    assert code == 2 and first.startswith((f"plangate: {path}", f"plangate: tools file {str(path)!r}")), out
    assert "Traceback" not in out, out
    assert not calls.exists()


# -- /metrics, and the compare and trace pages --------------------------------------------------

XSS = '</title><script>alert(1)</script>"onmouseover="alert(2)\' <svg onload=alert(3)>]]><!--'
RAW = ("<script>alert", "<svg onload", '"onmouseover="alert', "</title><script", "]]><!--")
"""The payload's pieces as they would read unescaped (the page's own ``</title><rect`` is fine)."""


@pytest.fixture
def served(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> Iterator[dict[str, Any]]:
    """A server with metrics behind a token, an extra requester, and two runs whose every free text is markup."""
    metrics.stop()
    setup = serverkit.setup(tmp_path, catalogue, policy, metrics=True, metrics_token="s3cret-scrape")
    with closing(open_store(setup["db"])) as store:
        accounts = Accounts(store)
        accounts.add("bob", "requester", password=serverkit.PASSWORD)
        setup["tokens"]["bob"] = accounts.issue_token("bob")
    runs = []
    for who in ("alice", "alice", "bob"):
        step = {
            **serverkit.MAIL["steps"][0],
            "rationale": XSS,
            "params": {"to": "a@example.com", "subject": XSS, "body": XSS},
        }
        body = {**serverkit.MAIL, "task": f"secret task of {who} {XSS}", "steps": [step]}
        record = api(setup, who).post("/api/plans", json=body).json()
        decided = api(setup, "dave").post(
            f"/api/plans/{record['id']}/approve", json={"hash": record["hash"], "comment": XSS}
        )
        assert decided.status_code == 200, decided.text
        assert api(setup, who).post(f"/api/plans/{record['id']}/execute").json()["status"] == "succeeded"
        runs.append(record["id"])
    unknown = {**serverkit.MAIL, "steps": [{**serverkit.MAIL["steps"][0], "tool": "exfil_secret_tool"}]}
    assert api(setup, "alice").post("/api/plans", json=unknown).json()["status"] == "rejected"
    setup["runs"] = runs
    yield setup
    metrics.stop()


def test_metrics_hold_no_plan_text_parameters_or_names(served: dict[str, Any], catalogue: Catalogue) -> None:
    reply = TestClient(served["app"]).get("/metrics", headers={"Authorization": "Bearer s3cret-scrape"})
    assert reply.status_code == 200
    for secret in ("secret task", "example.com", "alice", "bob", "dave", "exfil_secret_tool", "onmouseover", "<"):
        assert secret not in reply.text, secret
    families = list(text_string_to_metric_families(reply.text))
    tools = {s.labels["tool"] for f in families for s in f.samples if "tool" in s.labels}
    assert tools and tools <= set(catalogue.names)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic s3cret-scrape",
        "Bearer s3cret-scrap",
        "Bearer s3cret-scrape\u00e9",
        "Bearer \u00e9",
    ],
)
def test_metrics_refuse_a_scrape_without_the_token(served: dict[str, Any], header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header.encode("latin-1")}  # as a client may send it
    reply = TestClient(served["app"]).get("/metrics", headers=headers)
    assert reply.status_code == 401 and "plangate_" not in reply.text


def test_compare_and_trace_escape_markup_from_plans_outputs_and_comments(served: dict[str, Any]) -> None:
    a, b, _ = served["runs"]
    client, _ = browser(served, "alice")
    pages = [client.get(f"/plans/{a}/compare", params={"with": b}), client.get(f"/plans/{a}/trace")]
    pages.append(client.get(f"/plans/{a}/compare", params={"with": XSS[:80]}))
    assert [p.status_code for p in pages] == [200, 200, 404]
    assert "secret task of alice" in pages[1].text and "&lt;script&gt;" in pages[1].text
    for page in pages:
        for raw in RAW:
            assert raw not in page.text, (page.url, raw)


def test_compare_with_someone_elses_plan_reveals_no_more_than_its_own_page(served: dict[str, Any]) -> None:
    a, _, theirs = served["runs"]
    client, _ = browser(served, "alice")
    compared = client.get(f"/plans/{a}/compare", params={"with": theirs})
    direct = client.get(f"/plans/{theirs}")
    missing = client.get(f"/plans/{a}/compare", params={"with": "0" * 8 + theirs[8:]})
    assert compared.status_code == direct.status_code == 403 and missing.status_code == 404
    for reply in (
        compared,
        client.get(f"/plans/{theirs}/trace"),
        client.get(f"/plans/{theirs}/compare", params={"with": a}),
    ):
        assert reply.status_code == 403 and "secret task of bob" not in reply.text and "onmouseover" not in reply.text


@pytest.mark.parametrize(
    ("timestamp", "signature", "why"),
    [
        ("\u00b2", "v0=00", "no valid X-Slack-Request-Timestamp"),
        (None, "v0=\u00e9", "the signature does not match"),
    ],
)
def test_a_slack_request_with_odd_headers_is_refused_not_crashed_on(
    timestamp: str | None, signature: str, why: str
) -> None:
    now = 1_700_000_000
    assert notify.verify("secret", timestamp or str(now), b"{}", signature, now=now) == why


def test_a_recent_plan_whose_events_are_backdated_is_left_whole(old: tuple[str, dict[str, str]]) -> None:
    """Clock trick: the time of each event is under its hash, so a plan made to look old does not verify."""
    url, ids = old
    tamper_all = "UPDATE events SET at = '2019-01-01T00:00:00.000000Z' WHERE plan_id = ?"
    with closing(open_store(url)) as store, store.transaction():
        assert store.command(tamper_all, (ids["recent"],)) > 1
    code, out = cli("retention", "purge", "--older-than", "100", "--yes", "--db", url)
    assert code == 2 and "the audit log was changed outside plangate (event" in out, out  # before anything is read
    with closing(open_store(url)) as store:
        assert store.get_plan(ids["recent"]).purged_at is None  # type: ignore[union-attr]
