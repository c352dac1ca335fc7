#!/usr/bin/env bash
# The demo: installs what is missing for the default major only (Debian's PostgreSQL 15: no other
# major is downloaded, and no cargo-pgrx: the test command installs it when it first needs it),
# starts the private cluster, builds the extension with plain cargo (pgrx's bindings found through
# PGRX_PG_CONFIG_PATH; the same rustflags as `cargo pgrx install`, so the test command's builds
# can reuse its dependencies) and installs the library with its control file and SQL scripts
# (scripts/sqlbuild.py writes the current install script as pgrx would), runs the demo program
# (demo/src/main.rs), prints its findings, and stops the cluster.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
logs=$root/target/demo-logs
mkdir -p "$logs"
export PG_CONFIG=${PG_CONFIG:-$(scripts/pg-env.sh config "$(scripts/pg-env.sh default)")}
major=$(scripts/pg-env.sh major "$PG_CONFIG")
bash scripts/setup.sh --demo
echo "building and installing the extension (log: target/demo-logs/build.log) ..."
# cargo-pgrx's own rustflags for a cdylib (cargo-pgrx src/cargo.rs, pgrx_cdylib_config_args).
cdylib='target.'"'"'cfg(all(target_family = "unix", not(target_os = "macos")))'"'"'.rustflags = ["-C", "link-arg=-Wl,--no-gc-sections"]'
PGRX_PG_CONFIG_PATH=$PG_CONFIG cargo --config "$cdylib" build --lib -p idempotency --no-default-features --features "pg$major" \
    >"$logs/build.log" 2>&1 || { tail -30 "$logs/build.log"; exit 1; }
# A new file, not one written over: a backend whose library file is overwritten dies of SIGBUS.
lib=$("$PG_CONFIG" --pkglibdir)/idempotency.so
cp target/debug/libidempotency.so "$lib.new" && mv -f "$lib.new" "$lib"
python3 scripts/sqlbuild.py install-files "$("$PG_CONFIG" --sharedir)/extension" --current >>"$logs/build.log"
cargo build -q -p idempotency-demo --bin demo >>"$logs/build.log" 2>&1 || { tail -30 "$logs/build.log"; exit 1; }
cargo run -q -p xtask -- pg start >/dev/null
trap 'cargo run -q -p xtask -- pg stop' EXIT
echo
"$root/target/debug/demo"
