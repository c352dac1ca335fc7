#!/usr/bin/env bash
# The release command: for each major given (default: every supported major), `cargo pgrx package`
# into target/packages/pgNN/root, then the installable files as
#   target/packages/pgNN/idempotency-VERSION-pgNN-linux-ARCH.tar.gz
# (lib/, extension/ and install.sh, which copies them into the directories of $PG_CONFIG, or of the
# pg_config on PATH). For Debian's PostgreSQL 15 also
#   target/packages/pg15/postgresql-15-idempotency_VERSION_ARCH.deb
# installing into Debian's own directories. Builds against scripts/pg-env.sh's pg_config of each
# major, or PG_CONFIG for its own major. Prints the path of each file it made.
#
#   scripts/package.sh [MAJOR ...]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
env_sh=$root/scripts/pg-env.sh
version=$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
debian_major=$("$env_sh" default)

[ -n "${IDEM_SETUP_DONE:-}" ] || bash scripts/setup.sh >&2

for major in ${*:-$("$env_sh" majors)}; do
    if [ -n "${PG_CONFIG:-}" ] && [ "$("$env_sh" major "$PG_CONFIG")" = "$major" ]; then
        config=$PG_CONFIG
    else
        config=$("$env_sh" config "$major")
    fi
    out=$root/target/packages/pg$major
    rm -rf "$out"
    mkdir -p "$out"
    # The release build (fat LTO), in the workspace's target/release (shared by every major and
    # scripts/bench.sh: only pgrx and the extension are compiled per major).
    (cd extension && cargo pgrx package --pg-config "$config" --no-default-features --features "pg$major" \
        --out-dir "$out/root") >"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; exit 1; }

    # The portable layout: the library and the extension's SQL and control files, by role.
    name=idempotency-$version-pg$major-linux-$arch
    mkdir -p "$out/$name/lib" "$out/$name/extension"
    cp "$out/root$("$config" --pkglibdir)"/idempotency.so "$out/$name/lib/"
    cp "$out/root$("$config" --sharedir)"/extension/idempotency* "$out/$name/extension/"
    # Every released install script and every update script, so that CREATE EXTENSION ... VERSION
    # of an older release and ALTER EXTENSION idempotency UPDATE work from the package.
    python3 "$root/scripts/sqlbuild.py" install-files "$out/$name/extension" >>"$out/build.log" 2>&1 \
        || { tail -30 "$out/build.log" >&2; exit 1; }
    cat >"$out/$name/install.sh" <<INSTALL
#!/bin/sh
# Installs idempotency $version for PostgreSQL $major into the directories of \$PG_CONFIG (or of the
# pg_config on PATH). Run as a user who may write there.
set -eu
here=\$(cd "\$(dirname "\$0")" && pwd)
pg_config=\${PG_CONFIG:-pg_config}
got=\$("\$pg_config" --version)
case "\$got" in
"PostgreSQL $major."*) ;;
*) echo "install.sh: this package is for PostgreSQL $major; \$pg_config is \$got" >&2; exit 1 ;;
esac
cp "\$here"/lib/idempotency.so "\$("\$pg_config" --pkglibdir)/"
cp "\$here"/extension/idempotency* "\$("\$pg_config" --sharedir)/extension/"
echo "installed idempotency $version into \$("\$pg_config" --pkglibdir) and \$("\$pg_config" --sharedir)/extension"
INSTALL
    chmod +x "$out/$name/install.sh"
    tar -czf "$out/$name.tar.gz" -C "$out" "$name"
    echo "$out/$name.tar.gz"

    # Debian's package: the same files at the paths of Debian's own PostgreSQL of this major.
    if [ "$major" = "$debian_major" ] && command -v dpkg-deb >/dev/null; then
        debian_config=$("$env_sh" debian)
        deb=$out/deb
        mkdir -p "$deb/DEBIAN" "$deb$("$debian_config" --pkglibdir)" "$deb$("$debian_config" --sharedir)/extension"
        cp "$out/$name/lib/idempotency.so" "$deb$("$debian_config" --pkglibdir)/"
        cp "$out/$name"/extension/* "$deb$("$debian_config" --sharedir)/extension/"
        cat >"$deb/DEBIAN/control" <<CONTROL
Package: postgresql-$major-idempotency
Version: $version
Architecture: $arch
Maintainer: idempotency maintainers <idempotency@localhost>
Depends: postgresql-$major, libc6
Section: database
Priority: optional
Description: at-most-once execution per idempotency key, for PostgreSQL $major
 The idempotency extension: reserve a key, run the side effect once, store its response and
 replay it to every retry.
CONTROL
        dpkg-deb --root-owner-group --build "$deb" "$out/postgresql-${major}-idempotency_${version}_$arch.deb" >/dev/null
        rm -rf "$deb"
        echo "$out/postgresql-${major}-idempotency_${version}_$arch.deb"
    fi
done
