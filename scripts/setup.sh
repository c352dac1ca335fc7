#!/usr/bin/env bash
# Installs what the tests, the demo and the benchmarks need, when it is missing; cheap when
# everything is already there: Debian's PostgreSQL 15, a relocatable tree of every other supported
# major (scripts/pg-env.sh), cargo-pgrx registered with all of them, pgspot, psycopg, grpcio. Debian 12, as root.
#
#   scripts/setup.sh                  every supported major
#   scripts/setup.sh --majors "15"    only these majors' PostgreSQL (Debian's 15: no download);
#                                     pgrx keeps every major it already knew
#   scripts/setup.sh --demo           only what the demo needs: the packages (Debian's 15); no
#                                     cargo-pgrx (the demo builds with plain cargo), no pgrx init,
#                                     no other major, no psycopg
set -euo pipefail

PGRX_VERSION=0.18.1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
env_sh=$repo/scripts/pg-env.sh

majors=$("$env_sh" majors)
demo=
case "${1:-}" in
"") ;;
--majors) majors=${2:?setup.sh --majors: give a list such as \"15\"} ;;
--demo) demo=1 ;;
*) echo "usage: scripts/setup.sh [--majors \"15 17\" | --demo]" >&2; exit 2 ;;
esac

say() { printf '[setup] %s\n' "$*"; }
root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# patchelf: scripts/pg-env.sh relinks the relocatable trees' modules to their own libraries.
# lintian: the package layer checks every major's .deb with it (about 45 s to install, 3 s a run);
# dpkg-dev: dpkg-shlibdeps, the .deb's library dependencies; rpm: rpmbuild, the .rpm (20 s).
packages=(postgresql-15 postgresql-server-dev-15 postgresql-15-cron libclang-dev clang sudo make fonts-dejavu-core unzip openssl patchelf lintian dpkg-dev rpm)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt: installing ${missing[*]}"
    root apt-get update -qq
    # The server and its dev package go together so their versions match (installing only the
    # dev package would upgrade a running server underneath us).
    root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi

# The demo needs nothing more: Debian's 15 came with the packages (or PG_CONFIG names a server).
[ -z "$demo" ] || exit 0

if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    say "cargo: installing cargo-pgrx $PGRX_VERSION (3-5 minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi

# The majors asked for (every supported one by default), registered with pgrx, together with
# those it already knows: `cargo pgrx init` rewrites its config with only the majors it is given,
# so a run that needs a major the config lacks (the test command after the demo) registers it with
# the others again. PG_CONFIG, when set, stands for its own major; the others come from
# scripts/pg-env.sh (Debian's 15, relocatable trees for the rest, downloaded on first use into
# target/).
default_major=$("$env_sh" major "${PG_CONFIG:-$("$env_sh" config "$("$env_sh" default)")}")
config_toml=${PGRX_HOME:-$HOME/.pgrx}/config.toml
have=$(grep -E '^pg[0-9]+ = ' "$config_toml" 2>/dev/null | sort || true)
init=()
missing=
for major in $("$env_sh" majors); do
    asked=
    for m in $majors; do [ "$m" = "$major" ] && asked=1; done
    known=$(printf '%s\n' "$have" | sed -n "s/^pg$major = \"\(.*\)\"$/\1/p")
    [ -z "$known" ] || [ -x "$known" ] || known= # a tree removed since: forgotten
    [ -n "$asked" ] || [ -n "$known" ] || continue
    if [ -n "${PG_CONFIG:-}" ] && [ "$major" = "$default_major" ]; then
        config=$PG_CONFIG
    elif [ -z "$asked" ]; then
        config=$known # registered earlier, not needed now: kept as it is
    else
        config=$("$env_sh" config "$major")
    fi
    init+=("--pg$major" "$config")
    [ -z "$asked" ] || [ "$known" = "$config" ] || missing+=" $major"
done
if [ -n "$missing" ] || [ ! -f "$config_toml" ]; then
    say "pgrx: init ${init[*]}"
    cargo pgrx init "${init[@]}" >/dev/null
fi

# psycopg 3: the Python example's driver (the python layer).
if ! python3 -c "import psycopg" 2>/dev/null; then
    say "pip: installing psycopg[binary]"
    python3 -m pip install --quiet --disable-pip-version-check 'psycopg[binary]' 2>&1 | grep -v 'Running pip as the' || true
fi

# grpcio and grpcio-tools: the gRPC layer's client that is not tonic
# (tests/tests/grpc_conformance.rs runs examples/python/grpc_check.py; protoc from grpc-tools).
if ! python3 -c "import grpc, grpc_tools" 2>/dev/null; then
    say "pip: installing grpcio grpcio-tools"
    python3 -m pip install --quiet --disable-pip-version-check grpcio grpcio-tools 2>&1 | grep -v 'Running pip as the' || true
fi

# jsonschema: the package layer validates META.json against the PGXN Meta Spec's schema.
if ! python3 -c "import jsonschema" 2>/dev/null; then
    say "pip: installing jsonschema"
    python3 -m pip install --quiet --disable-pip-version-check jsonschema 2>&1 | grep -v 'Running pip as the' || true
fi

if ! python3 -c "import pgspot" 2>/dev/null; then
    say "pip: installing pgspot"
    python3 -m pip install --quiet --disable-pip-version-check pgspot 2>&1 | grep -v 'Running pip as the' || true
fi

# The test servers listen on 55400-56999, inside Linux's ephemeral port range: an outgoing
# connection (a load test, a pool) may take one of those ports for a while (TIME-WAIT) and a
# server start then fails. Reserve the range for listeners (as root; skipped when not allowed).
reserved=/proc/sys/net/ipv4/ip_local_reserved_ports
if [ -w "$reserved" ] && ! grep -q '55400-56999' "$reserved"; then
    current=$(cat "$reserved")
    echo "${current:+$current,}55400-56999" >"$reserved" 2>/dev/null && say "reserved ports 55400-56999 for the test servers" || true
fi
