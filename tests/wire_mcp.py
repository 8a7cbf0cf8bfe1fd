"""An MCP server that writes JSON-RPC itself, for attacks on overlapping calls: ``wire_mcp.py FOLDER``.

The SDK's server answers each request once, by its id; this one says what a test wants, when
it wants, one line at a time on stdout. Every call is written to ``FOLDER/calls.jsonl`` first
(tool, note, the request's ``_meta``), so a test sees each effect the server made. Each answer
is ``NOTE KEY``: the note and the idempotency key of the request it answers.

- ``pair`` (a read) holds its answer until a second ``pair`` call has come, then answers a
  request id it was never sent, the second call, the first, and the first again with another text;
- ``die`` (a write, not idempotent) and ``again`` (a write, idempotent): once one of each has come,
  the server exits without answering either, on its first life only (``FOLDER/died`` marks it);
- ``slow`` (a read) is answered late: just before the answer to the next call, whatever it is;
- ``echo`` (a read) answers at once.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

TEXT = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
READ = {"readOnlyHint": True, "openWorldHint": False}
TOOLS = [
    {"name": "pair", "inputSchema": TEXT, "annotations": READ},
    {"name": "slow", "inputSchema": TEXT, "annotations": READ},
    {"name": "echo", "inputSchema": TEXT, "annotations": READ},
    {"name": "die", "inputSchema": TEXT},
    {"name": "again", "inputSchema": TEXT, "annotations": {"destructiveHint": False, "idempotentHint": True}},
]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def answer(request: dict[str, Any], text: str | None = None) -> None:
    params = request["params"]
    said = text or f"{params['arguments']['note']} {params['_meta']['plangate/idempotency_key']}"
    send({"id": request["id"], "result": {"content": [{"type": "text", "text": said}]}})


def main(folder: Path) -> None:
    held: dict[str, list[dict[str, Any]]] = {"pair": [], "die": [], "again": [], "slow": []}
    first_life = not (folder / "died").exists()
    for line in sys.stdin:
        request = json.loads(line)
        method, params = request.get("method"), request.get("params") or {}
        if "id" not in request or method is None:
            continue  # a notification, or an answer to a request of ours: nothing to say
        if method == "initialize":
            info = {"name": "wire", "version": "1"}
            version = params["protocolVersion"]
            send(
                {
                    "id": request["id"],
                    "result": {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info},
                }
            )
            continue
        if method == "tools/list":
            send({"id": request["id"], "result": {"tools": TOOLS}})
            continue
        if method != "tools/call":
            send({"id": request["id"], "error": {"code": -32601, "message": f"no {method}"}})
            continue
        name = params["name"]
        with (folder / "calls.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": name, "note": params["arguments"]["note"], "meta": params["_meta"]}) + "\n")
        for late in held.pop("slow", []):
            answer(late)  # the answer to a call whose time ran out, before this call's own
        held.setdefault("slow", [])
        if name in held and (name not in {"die", "again"} or first_life):
            held[name].append(request)
        else:
            answer(request)
        if len(held["pair"]) == 2:
            first, second = held["pair"]
            send({"id": 987654, "result": {"content": [{"type": "text", "text": "never asked"}]}})
            answer(second)
            answer(first)
            answer(first, "a second answer to the first call")
            held["pair"] = []
        if held["die"] and held["again"]:
            (folder / "died").write_text("yes")
            os._exit(3)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
