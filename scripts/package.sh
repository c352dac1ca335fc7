#!/usr/bin/env bash
# The release command: for each major given (default: every supported major), `cargo pgrx package`
# into target/packages/pgNN/root, then
#   target/packages/pgNN/idempotency-VERSION-pgNN-linux-ARCH.tar.gz
#     one directory of its own: lib/idempotency.so, share/extension/ (the control file, the
#     install script of every release and every update script) and install.sh, which copies them
#     into the directories of $PG_CONFIG (or of the pg_config on PATH). The same layout is an
#     extension image's (CloudNativePG) and what PostgreSQL 18 loads from where it lies, through
#     extension_control_path (DIR/share) and dynamic_library_path (DIR/lib) (docs/upgrading.md).
#   target/packages/pgNN/postgresql-NN-idempotency_VERSION_ARCH.deb
#     named and laid out as PostgreSQL's own Debian packages (Debian's and apt.postgresql.org's):
#     /usr/lib/postgresql/NN/lib, /usr/share/postgresql/NN/extension, Depends: postgresql-NN
#     (where dpkg-deb is installed).
#   target/packages/pgNN/idempotency_NN-VERSION-1.ARCH.rpm
#     named and laid out as the PostgreSQL RPM repository's: /usr/pgsql-NN/lib,
#     /usr/pgsql-NN/share/extension, Requires: postgresqlNN-server (where rpmbuild is installed).
# and, once per run, the PGXN distribution (the major-independent source with its META.json):
#   target/packages/pgxn/META.json, target/packages/pgxn/idempotency-VERSION.zip
# Builds against scripts/pg-env.sh's pg_config of each major, or PG_CONFIG for its own major. The
# version is the root Cargo.toml's. Prints the path of each file it made.
#
#   scripts/package.sh [MAJOR ...]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
env_sh=$root/scripts/pg-env.sh
version=$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
# The project has no public address yet: this one is lintian's bogus-mail-host (the package layer
# leaves that tag out); change it here, the one place (the .deb, its changelog, META.json).
maintainer='idempotency maintainers <idempotency@localhost>'
abstract='At-most-once execution per idempotency key: reserve, complete, recover and sweep in SQL'

[ -n "${IDEM_SETUP_DONE:-}" ] || bash scripts/setup.sh >&2

# deb MAJOR DIR: the Debian package of DIR (the portable layout) for PostgreSQL MAJOR.
deb() {
    local major=$1 dir=$2 out package stage docdir years shlibs
    out=$(dirname "$dir")
    package=postgresql-$major-idempotency
    stage=$out/deb
    docdir=$stage/usr/share/doc/$package
    # The years of the history: the first commit's to HEAD's (one year when they are the same).
    years=$( (git log --format=%cd --date=format:%Y 2>/dev/null || true) | sed -n '1p;$p' | sort -u | paste -sd- -)
    years=${years:-$(date -u +%Y)}
    rm -rf "$stage"
    mkdir -p "$stage/DEBIAN" "$stage/usr/lib/postgresql/$major/lib" "$stage/usr/share/postgresql/$major/extension" "$docdir"
    install -m 0644 "$dir/lib/idempotency.so" "$stage/usr/lib/postgresql/$major/lib/"
    # As dh_strip does: no symbols for debugging in the installed library.
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stage/usr/lib/postgresql/$major/lib/idempotency.so"
    install -m 0644 "$dir"/share/extension/* "$stage/usr/share/postgresql/$major/extension/"
    cat >"$docdir/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: idempotency

Files: *
Copyright: $years the idempotency authors
License: MIT or Apache-2.0
 The idempotency extension is dual-licensed under the MIT license and the
 Apache License, version 2.0, at your option. On Debian systems the Apache
 License 2.0 is in /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
    printf 'idempotency (%s) unstable; urgency=medium\n\n  * Release %s: see CHANGELOG.md of the source.\n\n -- %s  %s\n' \
        "$version" "$version" "$maintainer" "$(date -R -u -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)")" | gzip -9n >"$docdir/changelog.gz"
    chmod 0644 "$docdir"/*
    (cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
    # The packages of the libraries it links (libc6, libgcc-s1) with their least versions, as
    # dpkg-shlibdeps computes them for Debian's own packages; unversioned without dpkg-dev.
    shlibs="libc6, libgcc-s1"
    if command -v dpkg-shlibdeps >/dev/null; then
        mkdir -p "$out/shlibs/debian"
        printf 'Source: idempotency\n\nPackage: %s\nArchitecture: any\n' "$package" >"$out/shlibs/debian/control"
        shlibs=$(cd "$out/shlibs" && dpkg-shlibdeps -O -e "$stage/usr/lib/postgresql/$major/lib/idempotency.so" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
        rm -rf "$out/shlibs"
    fi
    cat >"$stage/DEBIAN/control" <<CONTROL
Package: $package
Source: idempotency
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: postgresql-$major, $shlibs
Section: database
Priority: optional
Description: at-most-once execution per idempotency key, for PostgreSQL $major
 The idempotency extension: reserve a key in the same transaction as the
 business write, run the side effect once, store its response and replay
 it to every retry.
CONTROL
    dpkg-deb --root-owner-group -Zxz --build "$stage" "$out/${package}_${version}_$arch.deb" >/dev/null
    rm -rf "$stage"
    echo "$out/${package}_${version}_$arch.deb"
}

# rpm MAJOR DIR: the RPM of DIR (the portable layout) for PostgreSQL MAJOR, named and laid out as
# the PostgreSQL RPM repository's (yum.postgresql.org) extension packages: idempotency_NN,
# /usr/pgsql-NN/lib and /usr/pgsql-NN/share/extension, Requires: postgresqlNN-server.
rpm() {
    local major=$1 dir=$2 out top
    out=$(dirname "$dir")
    top=$out/rpmbuild
    rm -rf "$top"
    mkdir -p "$top/SPECS"
    cat >"$top/SPECS/idempotency.spec" <<SPEC
%global debug_package %{nil}
Name: idempotency_$major
Version: $version
Release: 1
Summary: At-most-once execution per idempotency key, for PostgreSQL $major
License: MIT OR Apache-2.0
Requires: postgresql$major-server
%description
The idempotency extension: reserve a key in the same transaction as the business write, run the
side effect once, store its response and replay it to every retry.
%install
mkdir -p %{buildroot}/usr/pgsql-$major/lib %{buildroot}/usr/pgsql-$major/share/extension
install -m 0755 $dir/lib/idempotency.so %{buildroot}/usr/pgsql-$major/lib/
install -m 0644 $dir/share/extension/* %{buildroot}/usr/pgsql-$major/share/extension/
%files
/usr/pgsql-$major/lib/idempotency.so
/usr/pgsql-$major/share/extension/idempotency*
SPEC
    rpmbuild -bb --quiet --nodeps --define "_topdir $top" --define "_build_id_links none" \
        "$top/SPECS/idempotency.spec" >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; exit 1; }
    mv "$top"/RPMS/*/"idempotency_$major-$version-1".*.rpm "$out/"
    rm -rf "$top"
    echo "$out"/"idempotency_$major-$version-1".*.rpm
}

# pgxn: META.json (PGXN Meta Spec 1.0, https://pgxn.org/meta/spec.txt) and the distribution,
# `git archive` of HEAD with META.json at its root.
pgxn() {
    local out=$root/target/packages/pgxn majors first last
    majors=$("$env_sh" majors)
    first=${majors%% *}
    last=${majors##* }
    rm -rf "$out"
    mkdir -p "$out"
    VERSION=$version ABSTRACT=$abstract MAINTAINER=$maintainer FIRST=$first LAST=$last REPOSITORY=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -1) \
        python3 - >"$out/META.json" <<'PY'
import json, os
v = os.environ["VERSION"]
# The supported majors (scripts/pg-env.sh), as a version range.
supported = ">= %s.0.0, < %d.0.0" % (os.environ["FIRST"], int(os.environ["LAST"]) + 1)
meta = {
    "name": "idempotency",
    "abstract": os.environ["ABSTRACT"],
    "description": "A PostgreSQL extension (Rust, pgrx) that makes 'a retried request runs at most once per key' a property of the database: idem_reserve claims (operation, user_id, key) in the same transaction as the business write, idem_complete stores the response with a fenced update, and every retry gets it replayed. Built with cargo-pgrx, not PGXS: see README.md, Install.",
    "version": v,
    "maintainer": [os.environ["MAINTAINER"]],
    "license": ["mit", "apache_2_0"],
    "provides": {
        "idempotency": {
            "abstract": os.environ["ABSTRACT"],
            "file": "extension/idempotency.control",
            "docfile": "docs/sql-reference.md",
            "version": v,
        }
    },
    "prereqs": {
        "runtime": {"requires": {"PostgreSQL": supported, "plpgsql": 0}},
        "build": {"requires": {"PostgreSQL": supported}},
    },
    "release_status": "stable",
    "tags": ["idempotency", "idempotency key", "at most once", "retries", "pgrx"],
    "no_index": {"directory": ["tests", "bench", "examples", "xtask", "testkit", "pgserver", "demo"]},
    "generated_by": "scripts/package.sh",
    "meta-spec": {"version": "1.0.0", "url": "https://pgxn.org/meta/spec.txt"},
}
repo = os.environ.get("REPOSITORY", "")
if repo:
    meta["resources"] = {
        "homepage": repo,
        "bugtracker": {"web": repo.rstrip("/") + "/issues"},
        "repository": {"url": repo.rstrip("/") + ".git", "web": repo, "type": "git"},
    }
print(json.dumps(meta, indent=2))
PY
    git archive --format=zip --prefix="idempotency-$version/" \
        --add-virtual-file="idempotency-$version/META.json:$(cat "$out/META.json")" \
        -o "$out/idempotency-$version.zip" HEAD
    echo "$out/META.json"
    echo "$out/idempotency-$version.zip"
}

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
    mkdir -p "$out/$name/lib" "$out/$name/share/extension"
    cp "$out/root$("$config" --pkglibdir)"/idempotency.so "$out/$name/lib/"
    cp "$out/root$("$config" --sharedir)"/extension/idempotency* "$out/$name/share/extension/"
    # Every released install script and every update script, so that CREATE EXTENSION ... VERSION
    # of an older release and ALTER EXTENSION idempotency UPDATE work from the package.
    python3 "$root/scripts/sqlbuild.py" install-files "$out/$name/share/extension" >>"$out/build.log" 2>&1 \
        || { tail -30 "$out/build.log" >&2; exit 1; }
    cat >"$out/$name/install.sh" <<INSTALL
#!/bin/sh
# Installs idempotency $version for PostgreSQL $major into the directories of \$PG_CONFIG (or of the
# pg_config on PATH). Run as a user who may write there. (On PostgreSQL 18 the directory may stay
# where it is instead: extension_control_path and dynamic_library_path, docs/upgrading.md.)
set -eu
here=\$(cd "\$(dirname "\$0")" && pwd)
pg_config=\${PG_CONFIG:-pg_config}
got=\$("\$pg_config" --version)
case "\$got" in
"PostgreSQL $major."*) ;;
*) echo "install.sh: this package is for PostgreSQL $major; \$pg_config is \$got" >&2; exit 1 ;;
esac
# Each file written beside its old copy and renamed over it: a running backend that has the old
# library mapped keeps it (copying over it in place can crash that backend with SIGBUS).
put() {
    cp "\$1" "\$2/.\$(basename "\$1").new"
    mv -f "\$2/.\$(basename "\$1").new" "\$2/\$(basename "\$1")"
}
put "\$here"/lib/idempotency.so "\$("\$pg_config" --pkglibdir)"
for f in "\$here"/share/extension/idempotency*; do
    put "\$f" "\$("\$pg_config" --sharedir)/extension"
done
echo "installed idempotency $version into \$("\$pg_config" --pkglibdir) and \$("\$pg_config" --sharedir)/extension"
INSTALL
    chmod +x "$out/$name/install.sh"
    tar -czf "$out/$name.tar.gz" -C "$out" "$name"
    echo "$out/$name.tar.gz"

    if command -v dpkg-deb >/dev/null; then
        deb "$major" "$out/$name"
    fi
    if command -v rpmbuild >/dev/null; then
        rpm "$major" "$out/$name"
    fi
done
if git rev-parse --git-dir >/dev/null 2>&1; then
    pgxn
else
    echo "package.sh: not a git clone: no PGXN distribution (it is git archive of HEAD)" >&2
fi
