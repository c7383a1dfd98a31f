#!/usr/bin/env bash
# The real agent CLIs the test suite drives (tests/realcli), at pinned versions, from the
# npm registry into .cache/clis (kept between runs; a version change reinstalls).
# Pins and why are in docs/runtimes/versions.md. `LATEST=1` installs the newest instead,
# into .cache/clis-latest, for `make test-latest-clis`.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=("@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.171.0" "@google/gemini-cli@0.61.0")
DIR=.cache/clis
if [[ "${LATEST:-}" == "1" ]]; then
    PINS=("@anthropic-ai/claude-code@latest" "@openai/codex@latest" "@google/gemini-cli@latest")
    DIR=.cache/clis-latest
    rm -f "$DIR/.installed"
fi
want="${PINS[*]}"
if [[ -f "$DIR/.installed" && "$(cat "$DIR/.installed")" == "$want" ]]; then
    exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "setup-clis: npm is needed (scripts/setup-system.sh installs it)" >&2; exit 1; }
echo "setup-clis: installing ${want} into $DIR (once; cached)..." >&2
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "${PINS[@]}" >&2
echo "$want" > "$DIR/.installed"
