#!/usr/bin/env bash
# Make PostgreSQL server binaries available to the test harness (tests/pg_harness.py).
#
# Idempotent, quiet, and instant when binaries are already there. The harness looks in
# $BACKCHANNEL_PG_BINDIR, then the pgserver wheel (a dev dependency, installed by pip),
# then Debian's /usr/lib/postgresql/*/bin. Only when none of these has them does this
# script install Debian's `postgresql` package (needs root or sudo). Nothing is started
# here: the harness starts a private server per test session.
#
# Usage: scripts/setup-postgres.sh [PYTHON]   (PYTHON defaults to .venv/bin/python)
set -euo pipefail

PY="${1:-.venv/bin/python}"

has_bins() { [[ -x "$1/postgres" && -x "$1/initdb" ]]; }

if [[ -n "${BACKCHANNEL_TEST_POSTGRES_URL:-}" ]]; then
    exit 0  # an external server is used; nothing to install
fi
if [[ -n "${BACKCHANNEL_PG_BINDIR:-}" ]] && has_bins "$BACKCHANNEL_PG_BINDIR"; then
    exit 0
fi
if [[ -x "$PY" ]]; then
    wheel_dir="$("$PY" -c 'import importlib.util as u, pathlib as p; s = u.find_spec("pgserver"); print(p.Path(s.origin).parent / "pginstall" / "bin" if s and s.origin else "")' 2>/dev/null || true)"
    if [[ -n "$wheel_dir" ]] && has_bins "$wheel_dir"; then
        exit 0
    fi
fi
for d in /usr/lib/postgresql/*/bin; do
    if has_bins "$d"; then
        exit 0
    fi
done

SUDO=""
if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo -n"
    else
        echo "setup-postgres: PostgreSQL binaries not found and not root: install the" \
             "'postgresql' package or run 'pip install pgserver'" >&2
        exit 1
    fi
fi
echo "setup-postgres: installing Debian's postgresql package" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
for d in /usr/lib/postgresql/*/bin; do
    if has_bins "$d"; then
        exit 0
    fi
done
echo "setup-postgres: postgresql installed but no server binaries under /usr/lib/postgresql" >&2
exit 1
