"""The audit log's keyed hash chain: how an event's hash is made, and how the chain is verified.

Each event's hash is the HMAC-SHA256, under the audit key, of its header (a compact JSON
array: sequence number, plan, version, step, kind, actor, time, the previous event's hash,
and the hash of the same plan's previous event) and the SHA-256 of its data in canonical
JSON (events written before schema version 9: the data itself), joined by newlines; the
digest lets a retention purge remove an event's payloads under a seal made with the key
(:meth:`Chain.purge_seal`) while the event keeps its hash. The second link makes each
plan's events a chain of their own, so one plan's story is checked before it runs
(:func:`verify_plan`) without walking the whole log. The key is kept outside the database
(``PLANGATE_AUDIT_KEY`` or a key file, see ``plangate._auditkey``); the store records only
the key's id (an HMAC of a fixed text under the key, which reveals nothing of the key)
when the first event is appended. A process with another key may not append (one log,
one key) and is told plainly that its key is not the log's, rather than that the log is
broken; a log with events but no key id was written before the chain was keyed, and is
reported as such, never as intact.

What someone who can write the database, but has no key, can do undetected, and not:

- edit, insert or reorder events: caught at the first event changed, since they cannot
  make a valid hash and every event's hash covers the one before;
- delete events in the middle: caught, as a gap in the sequence numbers;
- delete the newest events and rewrite the head the store keeps beside the log: *not*
  caught by the log alone, since what is left is a valid chain. Keep the head elsewhere
  too (``plangate audit head`` prints it) and verify that the log still holds it
  (``plangate audit verify --head SEQ:HASH``).

Whoever holds the key can rewrite the whole log: guard it like a signing key.

Verification hashes the data text as stored, not a re-serialisation of the parsed data.
The hash then covers exactly the bytes the store holds, so any edit to them is caught,
even one that leaves the JSON meaning alone; and no JSON is parsed, which makes
verifying about twice as fast. Both backends keep the text exactly as written (a
``TEXT`` column); a backend that kept JSON in its own layout (PostgreSQL's ``jsonb``)
would have to hash the canonical re-serialisation instead.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from plangate._auditkey import FILE_VARIABLE, KEY_VARIABLE, key_path
from plangate._encode import reused_encoder
from plangate.plan import canonical

GENESIS = "0" * 64
_HEADER = reused_encoder(json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False))
COLUMNS = "seq, plan_id, version, step_id, kind, actor, at, data, prev, hash, plan_prev, data_hash"
"""An event as the hash covers it: ``prev`` links it to the event before it in the log,
``plan_prev`` to the event before it of the same plan (GENESIS for a plan's first),
``data_hash`` the SHA-256 of its data as first written (None: an event hashed over its data
itself, written before events could be purged)."""
KEY_ID = "audit_key_id"
"""The ``settings`` row naming the key the log is written with."""

_SET_KEY = f"set {KEY_VARIABLE} or {FILE_VARIABLE} to the key it was written with"
UNKEYED = (
    "the audit log has events but no key id: it was written before plangate keyed its audit chain, with plain "
    "SHA-256 that anyone who can write the database can recompute, so it cannot be verified, and plangate "
    "appends no keyed events to it; start a new store"
)


def key_id(key: bytes) -> str:
    """The key's public name: 16 hex digits of an HMAC of a fixed text, from which the key cannot be found."""
    return hmac.new(key, b"plangate key id", hashlib.sha256).hexdigest()[:16]


class Chain:
    """The hashes under one key: :meth:`hash` of an event, and the key's :attr:`key_id`."""

    __slots__ = ("_mac", "key_id")

    def __init__(self, key: bytes) -> None:
        keyed = hmac.new(key, digestmod=hashlib.sha256)  # keyed once, copied for each event
        # The C object behind it where there is one: the same HMAC, without a Python wrapper per call.
        self._mac: hmac.HMAC = getattr(keyed, "_hmac", None) or keyed  # the same methods
        self.key_id = key_id(key)

    def hash(self, row: Sequence[Any]) -> str:
        """The hash of an event given as its row (:data:`COLUMNS`), its data as text; its own hash is ignored.

        With a ``data_hash`` the hash covers the digest, and the data must be the text that
        digest names or a purge this key sealed (:func:`purge_seal`); else the answer is ``""``,
        which matches no stored hash. The two forms cannot be taken for each other: the
        second's text starts with ``2``, the first's with the header's ``[``.
        """
        digest = row[11] if len(row) > 11 else None
        if not isinstance(row[7], str):
            return ""  # plangate writes its data as text: bytes were put there outside it
        try:
            if digest is None:
                mac = self._mac.copy()
                mac.update(f"{_header(row)}\n{row[7]}".encode())
                return mac.hexdigest()
            if data_digest(row[7]) == digest or self._sealed_purge(row[0], digest, row[7]):
                return self.sign(row)
        except TypeError:  # a header column stored as bytes: put there outside plangate
            pass
        return ""

    def sign(self, row: Sequence[Any]) -> str:
        """The hash of a row whose ``data_hash`` is the digest of its data, as an append just computed it.

        The same formula as :meth:`hash` (which checks the digest against the data first):
        a new event's data is digested once, not once more to be signed.
        """
        mac = self._mac.copy()
        mac.update(f"2\n{_header(row)}\n{row[11]}".encode())
        return mac.hexdigest()

    def purge_seal(self, seq: int, digest: str, kept: str) -> str:
        """The tag that lets an event's data be ``kept`` (what a purge left) instead of what ``digest`` names."""
        mac = self._mac.copy()
        mac.update(f"purged\n{seq}\n{digest}\n{kept}".encode())
        return mac.hexdigest()

    def _sealed_purge(self, seq: int, digest: str, text: str) -> bool:
        """Whether ``text`` is what a purge by this key left of event ``seq`` (its data's ``purged`` names the seal).

        The purge wrote its data in canonical JSON, and the seal covers that text less the
        seal: text that only means the same (its keys in another order, white space, escapes)
        is not what was sealed, and is reported as edited, as any other event's would be. Text
        a purge cannot have written (not JSON, nested past the stack, NaN, a lone surrogate, a
        seal not in ASCII) is simply not sealed: the event is reported as edited, never crashed on.
        """
        try:
            data = json.loads(text)
            if canonical(data) != text:
                return False
            marker = data.get("purged") if isinstance(data, dict) else None
            seal = marker.pop("seal", None) if isinstance(marker, dict) else None
            if not isinstance(seal, str):
                return False
            return hmac.compare_digest(seal.encode(), self.purge_seal(seq, digest, canonical(data)).encode())
        except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
            return False

    def seal_text(self, text: str) -> str:
        """A tag, under the key, of a row kept outside the log (a plan's newest event, a register entry)."""
        mac = self._mac.copy()
        mac.update(f"seal\n{text}".encode())
        return mac.hexdigest()


def _header(row: Sequence[Any]) -> str:
    """seq .. at, prev, plan_prev, as a JSON array."""
    return _HEADER((*row[:7], row[8], row[10]))


def data_digest(text: str) -> str:
    """What an event's hash commits to in place of its data: the SHA-256 of the data's text."""
    return hashlib.sha256(text.encode()).hexdigest()


def key_problem(written_with: str | None, chain: Chain | None, *, has_events: bool) -> str | None:
    """Why this process's key cannot append to or verify the log (another key, none, an unkeyed log), or None."""
    if written_with is None:
        return UNKEYED if has_events else None
    if chain is None:
        return (
            f"the audit log was written with key id {written_with}, and this process has no audit key "
            f"({KEY_VARIABLE} is not set and there is no key file at {key_path()}): {_SET_KEY}"
        )
    if chain.key_id != written_with:
        return (
            f"the audit log was written with another key (key id {written_with}; this process has "
            f"{chain.key_id}): {_SET_KEY}"
        )
    return None


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    """The verdict on the whole log: ``ok``, how many events, the head; or what is wrong.

    ``bad_seq`` names the first event that does not fit; it is None when the log could not
    be checked at all (another key, no key, an unkeyed log).
    """

    ok: bool
    events: int
    head_seq: int
    head_hash: str
    problem: str | None = None
    bad_seq: int | None = None
    key_id: str | None = None
    tables: tuple[str, ...] = ()
    """Rows that disagree with an intact log (see :func:`plangate.ledger.verify`)."""

    def __str__(self) -> str:
        if self.tables:
            more = "".join(f"\n  {problem}" for problem in self.tables)
            return f"audit log intact, but {len(self.tables)} stored row(s) disagree with it:{more}"
        if self.ok:
            key = f", key id {self.key_id}" if self.key_id else ""
            return f"audit log intact: {self.events} events, head {self.head_seq} {self.head_hash}{key}"
        if self.bad_seq is None:
            return f"audit log NOT VERIFIED: {self.problem}"
        return f"audit log BROKEN at event {self.bad_seq}: {self.problem}"


@dataclass
class _Walked:
    """How far the walk got, and the hashes of the events a head names."""

    events: int = 0
    seq: int = 0
    hash: str = GENESIS
    named: dict[int, str] = field(default_factory=dict)


def verify(
    rows: Iterable[Sequence[Any]],
    *,
    written_with: str | None,
    key: bytes | None,
    head: tuple[int, str] | None,
    anchor: tuple[int, str] | None = None,
) -> AuditReport:
    """Walk the log in order; name the first event that does not fit the chain.

    ``rows``: the events table's rows in sequence order, as :data:`COLUMNS` (the data as
    its stored text). ``written_with``: the key id
    the store records; ``key``: this process's key. ``head``: the head the store keeps
    beside the log; ``anchor``: a head kept elsewhere. The log must hold each head's event,
    at its sequence number with its hash; events after a head are fine (only a key holder
    can add them).
    """
    heads = {"its recorded head": head, "the anchored head": anchor}
    walked = _Walked(named={at[0]: "" for at in heads.values() if at is not None})
    rows = iter(rows)
    first = next(rows, None)
    if first is not None:
        rows = itertools.chain([first], rows)
        chain = Chain(key) if key is not None else None
        problem = key_problem(written_with, chain, has_events=True)
        if problem is not None or chain is None:
            return _unverified(rows, problem or UNKEYED)
        if (bad := _walk(rows, chain, walked)) is not None:
            return _report(walked, *bad)
    for what, at in heads.items():
        if at is not None and (bad := _holds(walked, at, what)) is not None:
            return _report(walked, *bad)
    return AuditReport(ok=True, events=walked.events, head_seq=walked.seq, head_hash=walked.hash, key_id=written_with)


def _walk(rows: Iterator[Sequence[Any]], chain: Chain, walked: _Walked) -> tuple[int, str] | None:
    """The first event that does not fit (its seq and why), or None; ``walked`` says how far it got."""
    named = walked.named
    for row in rows:
        seq, before = row[0], walked.seq
        walked.events += 1
        if seq != before + 1:
            return seq, f"expected event {before + 1} here, found event {seq}: events were deleted or reordered"
        if row[8] != walked.hash:
            return seq, f"it does not follow event {before} (its previous-hash is not event {before}'s hash)"
        if chain.hash(row) != row[9]:
            return seq, f"its content does not match its hash ({row[4]} for plan {row[1]}): it was edited"
        walked.seq, walked.hash = seq, row[9]
        if seq in named:
            named[seq] = row[9]
    return None


def _holds(walked: _Walked, at: tuple[int, str], what: str) -> tuple[int, str] | None:
    """Whether the walked log holds the event a head names; if not, where it parts and why."""
    seq, digest = at
    if seq > walked.seq:
        return (
            walked.seq + 1,
            f"the log ends at event {walked.seq} but {what} is event {seq}: events were cut off the end",
        )
    found = GENESIS if seq == 0 else walked.named.get(seq, "")
    if found != digest:
        return seq, (
            f"its hash is {found[:16]}..., but {what} says {digest[:16]}...: the log does not extend {what} "
            "(it was rewritten from here, or the head is of another log)"
        )
    return None


def _report(walked: _Walked, bad_seq: int, problem: str) -> AuditReport:
    return AuditReport(
        ok=False, events=walked.events, head_seq=walked.seq, head_hash=walked.hash, problem=problem, bad_seq=bad_seq
    )


def _unverified(rows: Iterable[Sequence[Any]], problem: str) -> AuditReport:
    """A log that cannot be checked: count it, and say why."""
    events, seq, digest = 0, 0, GENESIS
    for row in rows:
        events, seq, digest = events + 1, row[0], row[9]
    return AuditReport(ok=False, events=events, head_seq=seq, head_hash=digest, problem=problem)


def verify_plan(rows: Iterable[Sequence[Any]], chain: Chain, before: str = GENESIS) -> tuple[int, str] | None:
    """Check one plan's events (rows of :data:`COLUMNS`, in order): the first that does not fit, or None.

    Each event must carry a valid hash and follow the plan's event before it, so an event
    of the plan that was changed, inserted or deleted is caught without walking the whole
    log. (Its newest events deleted, with its rows set back to match, is caught by the
    whole log's check, and by a head kept elsewhere.) ``before`` is the hash of the event the
    rows follow (a caller that verified the events before them).
    """
    for row in rows:
        if row[10] != before:
            return row[0], "it does not follow the plan's event before it: events of the plan were deleted"
        if chain.hash(row) != row[9]:
            return row[0], f"its content does not match its hash ({row[4]}): it was edited"
        before = row[9]
    return None


def tail_text(plan_id: str, seq: int, digest: str) -> str:
    """What a plan's seal covers: the plan and its newest event."""
    return f"tail\n{plan_id}\n{seq}\n{digest}"


def tail_problem(chain: Chain, plan_id: str, last: tuple[int, str] | None, sealed: str | None) -> str | None:
    """Whether the plan's newest event is the one sealed beside it (:meth:`Chain.seal_text`); if not, why.

    Deleting a plan's newest events leaves a valid chain of the plan's events; the seal,
    which only a key holder can make, says where that chain must end.
    """
    if last is None:
        return None
    seq, _, rest = (sealed if isinstance(sealed, str) else "").partition(":")  # bytes: written outside plangate
    digest, _, tag = rest.partition(":")
    number = seq.isascii() and seq.isdigit()  # "²".isdigit() too, but int() refuses it
    expected = chain.seal_text(tail_text(plan_id, int(seq) if number else -1, digest))
    if not sealed or not number or not hmac.compare_digest(tag.encode(), expected.encode()):
        return "the seal naming the plan's newest event is missing or was forged"
    if (int(seq), digest) != last:
        return (
            f"the plan's newest event should be event {seq}, but its events end at event {last[0]}: "
            "events of the plan were deleted"
        )
    return None
