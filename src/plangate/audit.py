"""The audit log's hash chain: how an event's hash is made, and how the chain is verified.

Each event's hash is the SHA-256 of the canonical JSON of its content together with the
previous event's hash, so editing, deleting or reordering any event breaks the chain at
that event. The store also keeps the head (the last sequence number and hash) beside the
log, so cutting events off the end is caught too; anyone who must guard against a
rewrite of the whole database keeps a copy of the head elsewhere (``plangate audit
verify`` prints it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from plangate.plan import canonical
from plangate.store._records import Event

GENESIS = "0" * 64


def event_hash(
    *,
    seq: int,
    plan_id: str | None,
    version: int | None,
    step_id: int | None,
    kind: str,
    actor: str,
    at: str,
    data: dict[str, Any] | str,
    prev: str,
) -> str:
    """SHA-256 of the event's header and its data, each in canonical JSON, joined by a newline.

    ``data`` may be given already in canonical JSON (the store writes that same text), so a
    large output is serialised once. Verification always re-serialises what it reads back,
    so the stored text's layout does not matter, only its content.
    """
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
    body = data if isinstance(data, str) else canonical(data)
    return hashlib.sha256(f"{canonical(header)}\n{body}".encode()).hexdigest()


def hash_of(event: Event, data_text: str | None = None) -> str:
    """What ``event``'s hash must be (``data_text``: its data already in canonical JSON)."""
    return event_hash(
        seq=event.seq,
        plan_id=event.plan_id,
        version=event.version,
        step_id=event.step_id,
        kind=event.kind,
        actor=event.actor,
        at=event.at,
        data=event.data if data_text is None else data_text,
        prev=event.prev,
    )


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    """The verdict on the whole log: ``ok``, how many events, the head, or the first bad event."""

    ok: bool
    events: int
    head_seq: int
    head_hash: str
    problem: str | None = None
    bad_seq: int | None = None

    def __str__(self) -> str:
        if self.ok:
            return f"audit log intact: {self.events} events, head {self.head_seq} {self.head_hash}"
        return f"audit log BROKEN at event {self.bad_seq}: {self.problem}"


def verify(events: Iterable[Event], head: tuple[int, str] | None) -> AuditReport:
    """Walk the log in order; name the first event that does not fit the chain."""
    prev_seq, prev_hash, count = 0, GENESIS, 0
    for event in events:
        count += 1
        if event.seq != prev_seq + 1:
            return _broken(
                count,
                prev_seq,
                prev_hash,
                event.seq,
                f"expected event {prev_seq + 1} here, found event {event.seq}: events were deleted or reordered",
            )
        if event.prev != prev_hash:
            return _broken(
                count,
                prev_seq,
                prev_hash,
                event.seq,
                f"it does not follow event {prev_seq} (its previous-hash is not event {prev_seq}'s hash)",
            )
        expected = hash_of(event)
        if event.hash != expected:
            return _broken(
                count,
                prev_seq,
                prev_hash,
                event.seq,
                f"its content does not match its hash ({event.kind} for plan {event.plan_id}): it was edited",
            )
        prev_seq, prev_hash = event.seq, event.hash
    if head is not None and head != (prev_seq, prev_hash):
        return _broken(
            count,
            prev_seq,
            prev_hash,
            prev_seq + 1,
            f"the log ends at event {prev_seq} but its recorded head is event {head[0]}: events were cut off the end",
        )
    return AuditReport(ok=True, events=count, head_seq=prev_seq, head_hash=prev_hash)


def _broken(count: int, seq: int, head: str, bad: int, problem: str) -> AuditReport:
    return AuditReport(ok=False, events=count, head_seq=seq, head_hash=head, problem=problem, bad_seq=bad)
