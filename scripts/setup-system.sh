#!/usr/bin/env bash
# System packages the test suite drives for real (a PostgreSQL server, Node.js with npm
# for the Claude Code lock interop test and the real agent CLIs, tmux, headless Chromium). Idempotent and quiet:
# it installs only what is missing, with Debian's apt, and does nothing when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
[[ -x /usr/bin/chromium ]] || need+=(chromium)  # the dashboard's browser tests
if [[ ${#need[@]} -gt 0 ]]; then
    SUDO=""
    if [[ "$(id -u)" -ne 0 ]]; then SUDO="sudo -n"; fi
    echo "setup: installing ${need[*]} with apt-get..." >&2
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
bash scripts/setup-postgres.sh .venv/bin/python
bash scripts/setup-clis.sh  # the real agent CLIs tests/realcli drives (pinned, cached)
