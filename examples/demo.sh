#!/usr/bin/env bash
# The demo: the example business's tools, then three plans through the checker and policy.
# Runs on embedded defaults: no network, no API key.
set -uo pipefail
cd "$(dirname "$0")/.."
TOOLS=examples/business.py
POLICY=examples/policy.yaml

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; printf '(exit %s)\n' "$?"; }

say "The catalogue: typed tools with governance metadata"
run plangate tools --tools "$TOOLS"

say "A clean plan: refund invoice 42 and tell the customer (alice, role support)"
run plangate check examples/plans/refund.json --tools "$TOOLS" --policy "$POLICY" --as alice

say "A plan the policy rejects: destructive SQL, a role without the right, two emails at once"
run plangate check examples/plans/cleanup.json --tools "$TOOLS" --policy "$POLICY" --as alice

say "A plan the checker rejects: every problem at once, each with its step and rule"
run plangate check examples/plans/broken.json --tools "$TOOLS" --policy "$POLICY" --as alice

say "Not a plan at all: a clear error, exit 2"
bad=$(mktemp --suffix=.json)
printf '{"task": "refund", "steps": [' > "$bad"
run plangate check "$bad" --tools "$TOOLS"
rm -f "$bad"
