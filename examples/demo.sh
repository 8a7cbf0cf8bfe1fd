#!/usr/bin/env bash
# The demo: the governed path end to end on the example business, on embedded defaults
# (SQLite, the bundled example, no network, no API key).
#   submit -> check -> policy -> approval -> execute -> trace -> audit verify
set -uo pipefail
cd "$(dirname "$0")/.."
DEMO=${PLANGATE_DEMO_DIR:-.plangate/demo}
rm -rf "$DEMO" && mkdir -p "$DEMO"
export PLANGATE_DB="sqlite:///$DEMO/plangate.db" PLANGATE_EXAMPLE_DB="$DEMO/business.db"
TOOLS=examples/business.py
POLICY=examples/policy.yaml

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; printf '(exit %s)\n' "$?"; }
submit() { plangate submit "$1" --tools "$TOOLS" --policy "$POLICY" --as "$2" --json; }
field() { python3 -c "import json, sys; print(json.load(sys.stdin)['$1'])"; }

say "The catalogue: typed tools with governance metadata"
run plangate tools --tools "$TOOLS"

say "alice (support) submits a plan: refund invoice 42 and tell the customer"
run plangate submit examples/plans/refund.json --tools "$TOOLS" --policy "$POLICY" --as alice
ID=$(plangate list --json | python3 -c "import json, sys; print(json.load(sys.stdin)[-1]['id'])")
HASH=$(plangate list --json | python3 -c "import json, sys; print(json.load(sys.stdin)[-1]['hash'])")
run plangate show "$ID"

say "Gate: nobody approves their own plan, nor runs an unapproved one"
run plangate approve "$ID" --as alice --hash "$HASH"
run plangate execute "$ID"

say "Gate: an approval is bound to the exact version reviewed"
run plangate approve "$ID" --as dave --hash "0000000000000000000000000000000000000000000000000000000000000000"

say "dave (approver) and carol (privacy officer) approve the hash they reviewed"
run plangate approve "$ID" --as dave --hash "$HASH" --comment "amount matches the invoice"
run plangate approve "$ID" --as carol --hash "$HASH" --comment "email to the customer only"

say "The engine runs it: no model, every step recorded before and after the call"
run plangate execute "$ID" --as ops
say "Executing a finished plan repeats nothing"
run plangate execute "$ID"

say "The approved plan joins the library: its task's values become typed slots"
run plangate library add "$ID" --name refund-and-tell --as dave

say "Planning offline, with no model: a new task fills the template (then check, policy, approval as ever)"
run plangate plan "Refund invoice 44 and tell the customer" --tools "$TOOLS" --policy "$POLICY" --as alice
run plangate run "Refund invoice 44 and tell the customer" --tools "$TOOLS" --policy "$POLICY" --as alice
NEXT=$(plangate list --json | python3 -c "import json, sys; print(json.load(sys.stdin)[-1]['id'])")
NEXT_HASH=$(plangate list --json | python3 -c "import json, sys; print(json.load(sys.stdin)[-1]['hash'])")
run plangate approve "$NEXT" --as dave --hash "$NEXT_HASH"
run plangate approve "$NEXT" --as carol --hash "$NEXT_HASH"
run plangate execute "$NEXT"

say "A plan the policy rejects: SQL that writes, a role without the right, two emails at once"
run plangate submit examples/plans/cleanup.json --tools "$TOOLS" --policy "$POLICY" --as alice

say "A plan that halts mid-way: the refund is refused, so the email is never sent"
HALT=$(submit examples/plans/halt.json alice | field id)
HALT_HASH=$(plangate list --json | python3 -c "import json, sys; print(json.load(sys.stdin)[-1]['hash'])")
run plangate approve "$HALT" --as dave --hash "$HALT_HASH"
run plangate execute "$HALT"
say "Nobody will resume it: dave closes it for good, and the reason is recorded"
run plangate close "$HALT" --reason "the customer withdrew the request" --as dave
run plangate resume "$HALT" --tools "$TOOLS"

say "The story of the refund, rebuilt from the audit log"
run plangate trace "$ID"

say "The audit log is intact (any edit, deletion or reordering would be named)"
# Hash-chained under a key kept outside the database: PLANGATE_AUDIT_KEY, or the key file
# PLANGATE_AUDIT_KEY_FILE (default ~/.config/plangate/audit.key, made on first use, mode 0600).
run plangate audit verify
say "Keep the head outside the database: a log cut short (its head row rewritten too) is then caught"
run plangate audit head
run plangate audit verify --head "$(plangate audit head | tr ' ' ':')"

say "An approved plan changed in the database, outside plangate, does not run; the audit names the row"
TAMPERED=$(submit examples/plans/halt.json alice | field id)
TAMPERED_HASH=$(plangate list --json | python3 -c "import json, sys; print(json.load(sys.stdin)[-1]['hash'])")
plangate approve "$TAMPERED" --as dave --hash "$TAMPERED_HASH" >/dev/null
python3 - "$DEMO/plangate.db" "$TAMPERED" <<'SQL'
import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as db:  # someone with access to the database, not to the audit key
    db.execute("UPDATE plan_versions SET body = replace(body, '\"43\"', '\"44\"') WHERE plan_id = ?", (sys.argv[2],))
SQL
echo "(the stored text of the approved plan now refunds invoice 44 instead of 43)"
run plangate execute "$TAMPERED"
run plangate audit verify
run plangate list

say "What the example business saw: two refunds, two emails (counted by the business itself)"
python3 -c "import sys; sys.path.insert(0, 'examples'); import business; print(business.effect_counts())"

if [ -n "${SERVE:-}" ]; then
  say "The dashboard, with the demo's plans in it (Ctrl-C to stop)"
  set -f  # the '*' below is a category pattern, not a file name
  # The first account needs nothing; after it, accounts change only with a governance account's token.
  printf 'demo-password\n' | plangate users add gina --role governance --category '*' --password-stdin
  PLANGATE_TOKEN=$(printf 'demo-password\n' | plangate login gina --password-stdin --print --expires 12h)
  export PLANGATE_TOKEN
  for who in "dave approver refunds" "carol approver *" "alice requester" "audrey auditor"; do
    set -- $who
    printf 'demo-password\n' | plangate users add "$1" --role "$2" ${3:+--category "$3"} --password-stdin
  done
  echo "log in at http://127.0.0.1:${PORT:-8420} as dave, carol, alice, gina or audrey, password demo-password"
  plangate serve --port "${PORT:-8420}" --tools "$TOOLS" --policy "$POLICY"
fi
