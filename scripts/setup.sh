#!/usr/bin/env bash
# Installs what the tests, the demo and the benchmarks need, when it is missing; cheap when
# everything is already there. Debian 12, as root (or with sudo).
set -euo pipefail

PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config

say() { printf '[setup] %s\n' "$*"; }
root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for pkg in postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo make fonts-dejavu-core; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt: installing ${missing[*]}"
    root apt-get update -qq
    # The server and its dev package go together so their versions match (installing only the
    # dev package would upgrade a running server underneath us).
    root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo make fonts-dejavu-core >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    say "cargo: installing cargo-pgrx $PGRX_VERSION (3-5 minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi

# `cargo pgrx init` rebuilds the bindings whenever it runs: only when pg15 is not configured.
if ! grep -qs "^pg15 = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    say "pgrx: init --pg15 $PG_CONFIG"
    cargo pgrx init --pg15 "$PG_CONFIG" >/dev/null
fi

if ! python3 -c "import pgspot" 2>/dev/null; then
    say "pip: installing pgspot"
    python3 -m pip install --quiet --disable-pip-version-check pgspot 2>&1 | grep -v 'Running pip as the' || true
fi
