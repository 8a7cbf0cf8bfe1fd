"""Telling reviewers: a Slack-compatible incoming-webhook message with approve/reject buttons.

The message links to the plan's page and carries Block Kit buttons whose value is
``plan_id:version:hash``: a click comes back to ``/slack/actions`` on the plangate server,
which checks Slack's request signature (``v0=`` HMAC-SHA256 of ``v0:timestamp:body`` with
the signing secret, at most five minutes old), maps the Slack user to the plangate account
linked to the chat user's id, and approves or rejects exactly that version (its number and
its hash: an edit back to the same text is a new version, which the button does not
decide), with the same rules as everywhere else.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

MAX_AGE = 300
REPLY_BYTES = 4096
"""The most of a webhook's reply a notice reads: it needs none of it, and a reply may say it is endless."""


@dataclass(frozen=True, kw_only=True)
class SlackNotifier:
    """Posts to a Slack-compatible incoming webhook when a plan waits for approval."""

    webhook_url: str
    base_url: str
    timeout: float = 5.0

    def message(self, record: Any) -> dict[str, Any]:
        link = f"{self.base_url.rstrip('/')}/plans/{record.id}"
        needs = " and by ".join(record.needs) or "a person"
        value = button_value(record.id, record.version, record.hash)
        return {
            "text": f"Plan waiting for approval: {escape(record.task)} ({escape(record.category)}) {link}",
            "blocks": [
                {
                    "type": "section",
                    "text": {
                        "type": "mrkdwn",
                        "text": (
                            f"*<{link}|{escape(record.task)}>*\ncategory *{escape(record.category)}*, requested by "
                            f"{escape(record.requested_by)}, version {record.version}; needs approval by {needs}"
                        ),
                    },
                },
                {"type": "context", "elements": [{"type": "mrkdwn", "text": f"hash `{record.hash}`"}]},
                {
                    "type": "actions",
                    "block_id": "plangate",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": "plangate_approve",
                            "style": "primary",
                            "value": value,
                            "text": {"type": "plain_text", "text": "Approve"},
                        },
                        {
                            "type": "button",
                            "action_id": "plangate_reject",
                            "style": "danger",
                            "value": value,
                            "text": {"type": "plain_text", "text": "Reject"},
                        },
                        {
                            "type": "button",
                            "action_id": "plangate_open",
                            "url": link,
                            "text": {"type": "plain_text", "text": "Review"},
                        },
                    ],
                },
            ],
        }

    def __call__(self, record: Any) -> str | None:
        """Send; returns None on success, or why it failed (a failed notice never fails the plan)."""
        body = json.dumps(self.message(record)).encode()
        request = urllib.request.Request(
            self.webhook_url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                reply.read(REPLY_BYTES)
        except OSError as exc:
            return f"the webhook failed: {exc}"
        return None


def button_value(plan_id: str, version: int, plan_hash: str) -> str:
    """What an approve or reject button carries: the plan, and the version it was sent for (number and hash)."""
    return f"{plan_id}:{version}:{plan_hash}"


def decided_by(value: str) -> tuple[str, int, str] | None:
    """The plan id, version and hash a button's value names; None for a value of another shape."""
    parts = value.split(":")
    if len(parts) != 3 or not all(parts) or not (parts[1].isascii() and parts[1].isdigit()) or len(parts[1]) > 10:
        return None
    return parts[0], int(parts[1]), parts[2]


def sign(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str, *, now: float | None = None) -> str | None:
    """None when the request is Slack's and fresh; otherwise why not."""
    if not (timestamp.isascii() and timestamp.isdigit()):  # "²".isdigit() too, but int() refuses it
        return "no valid X-Slack-Request-Timestamp"
    if abs((now if now is not None else time.time()) - int(timestamp)) > MAX_AGE:
        return "the request is more than five minutes old"
    if not hmac.compare_digest(sign(secret, timestamp, body).encode(), signature.encode()):  # any text, no TypeError
        return "the signature does not match"
    return None


def escape(text: str) -> str:
    """The requester's text as text in chat markup: no link, mention or button label of its own."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
