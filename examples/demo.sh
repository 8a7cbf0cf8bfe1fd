#!/usr/bin/env bash
# The demo: the governed path end to end on the example business, on embedded defaults
# (SQLite, the bundled example, no network, no API key).
#   submit -> check -> policy -> approval -> execute -> trace -> audit verify
# It is `plangate demo` (src/plangate/cli/_demo.py), the same story a `pip install plangate`
# tells; SERVE=1 leaves the dashboard up with the demo's plans in it.
set -euo pipefail
cd "$(dirname "$0")/.."
exec plangate demo --dir "${PLANGATE_DEMO_DIR:-.plangate/demo}" ${SERVE:+--serve --port "${PORT:-8420}"}
