#!/usr/bin/env python3
"""Builds every SQL artefact that is not loaded by the extension itself, from the same sources.

    sqlbuild.py versions                      the version chain: released snapshots, then current
    sqlbuild.py upgrade FROM TO               the extension's update script idempotency--FROM--TO.sql
    sqlbuild.py install-files DIR             writes every released install script and every update
                                              script of the chain into DIR (an extension directory)
    sqlbuild.py install-files DIR --current   the same, and the current version's install script
                                              and control file, as `cargo pgrx install` writes them
                                              (the demo installs a plain `cargo build` with them)
    sqlbuild.py portable [VERSION]            the portable install (psql -v schema=NAME -f ...)
    sqlbuild.py portable-upgrade FROM TO      the portable upgrade between two consecutive versions
    sqlbuild.py pgtle                         the pg_tle wrapper (pgtle.install_extension and
                                              pgtle.install_update_path), not tested here

Sources (nothing here is kept twice):
  sql/*.sql                   the current version, in the order extension/src/lib.rs loads them
  sql/released/idempotency--V.sql   the install script of every released version, as shipped
  sql/upgrade/idempotency--A--B.sql the hand-written part of each update: what a replay of the
                              function definitions cannot do (tables, types, indexes, dropped or
                              re-typed functions, data). May be empty.
  sql/portable/*.sql          the portable replacements of the LANGUAGE c functions, one per
                              signature, and nothing else

An update script is its hand-written part followed by a replay of every function definition of the
target version (CREATE OR REPLACE FUNCTION), its function comments and its privilege statements.
The schema comparison in the upgrade layer (xtask/src/layers/upgrade.rs) proves the result equals a fresh install.

The portable build is a generic transformation of a version's statements: LANGUAGE c functions
are swapped for their sql/portable replacements (matched by signature, all or nothing),
extension-only statements (pg_extension_config_dump, ALTER EXTENSION) are dropped, and each
statement is executed by psql with @extschema@ replaced by the target schema.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXT = "idempotency"
# The first version published as a portable install; portable upgrade scripts start here.
FIRST_PORTABLE = (0, 2, 0)
TAG = "$idem_stmt$"


def die(msg):
    sys.stderr.write(f"sqlbuild: {msg}\n")
    sys.exit(1)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def vkey(version):
    return tuple(int(p) for p in version.split("."))


def current_version():
    m = re.search(r'^\s*version\s*=\s*"([^"]+)"', read(os.path.join(ROOT, "Cargo.toml")), re.M)
    if not m:
        die("no version in Cargo.toml")
    return m.group(1)


def released_versions():
    d = os.path.join(ROOT, "sql", "released")
    out = []
    for name in os.listdir(d) if os.path.isdir(d) else []:
        m = re.fullmatch(rf"{EXT}--([0-9.]+)\.sql", name)
        if m:
            out.append(m.group(1))
    return sorted(out, key=vkey)


def chain():
    cur = current_version()
    versions = released_versions()
    if versions and vkey(versions[-1]) > vkey(cur):
        die(f"released {versions[-1]} is newer than Cargo.toml's {cur}")
    if cur not in versions:
        versions.append(cur)
    return versions


def split(text):
    """Top-level statements of a SQL text, each with the `--` comment block just above it.

    Knows comments, quoted strings and identifiers, E'' strings and dollar quotes; enough for
    the sources of this project, and it fails loudly on anything unterminated."""
    out, i, n, start, code = [], 0, len(text), 0, None
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                die("unterminated /* comment")
            i = j + 2
            continue
        if code is None and not c.isspace():
            code = i  # the statement itself starts here; what precedes it is comments
        if c == "'" or c == '"':
            escaped = c == "'" and i > 0 and text[i - 1] in "eE" and (i < 2 or not (text[i - 2].isalnum() or text[i - 2] == "_"))
            j = i + 1
            while True:
                if j >= n:
                    die(f"unterminated quote at {text[i:i + 40]!r}")
                if escaped and text[j] == "\\":
                    j += 2
                    continue
                if text[j] == c:
                    if j + 1 < n and text[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
        elif c == "$":
            m = re.match(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$", text[i:])
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                tag = m.group(0)
                j = text.find(tag, i + len(tag))
                if j < 0:
                    die(f"unterminated dollar quote {tag}")
                i = j + len(tag)
            else:
                i += 1
        elif c == ";":
            # The `--` lines directly above the statement (no blank line between) document it.
            block = []
            for line in reversed(text[start:code].splitlines()):
                if not line.strip().startswith("--"):
                    if block or line.strip():
                        break
                    continue
                block.insert(0, line.rstrip())
            out.append(Stmt(block, text[code:i + 1].strip()))
            i += 1
            start, code = i, None
        else:
            i += 1
    if code is not None:
        die(f"text after the last statement: {text[code:code + 60]!r}")
    return out


def identity_types(args):
    """The argument types that identify a function (no names, defaults or OUT arguments)."""
    parts, depth, cur = [], 0, ""
    for ch in args:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    out = []
    for part in parts:
        words = re.split(r"\s+DEFAULT\s+|\s*=\s*", part.strip(), maxsplit=1, flags=re.I)[0].split()
        mode = "in"
        if words and words[0].upper() in ("IN", "OUT", "INOUT", "VARIADIC"):
            mode = words.pop(0).lower()
        if mode != "out":
            out.append(" ".join(words[1:]).lower())  # every argument of the sources is named
    return out


class Stmt:
    def __init__(self, comments, sql):
        self.comments = comments
        self.sql = sql
        head = " ".join(sql.split())
        self.head = head
        # Procedures are routines like functions: replayed, commented and granted alike.
        m = re.match(r"CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE)\s+([^\s(]+)\s*\(", head)
        self.kind = "other"
        self.key = None
        if m:
            self.kind = "function"
            # The signature as written: name and argument list (parentheses balanced),
            # whitespace-normalised.
            depth, j = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(head[j], 0)
                j += 1
            self.key = m.group(1) + "(" + head[m.end():j - 1].strip() + ")"
            self.identity = m.group(1).lower() + "(" + ",".join(identity_types(head[m.end():j - 1])) + ")"
            header = head.split(" AS ", 1)[0]
            self.language = re.search(r"\bLANGUAGE\s+(\w+)", header, re.I).group(1).lower()
        elif re.match(r"COMMENT ON (?:FUNCTION|PROCEDURE)\b", head):
            self.kind = "function_comment"
        elif re.match(r"(REVOKE|GRANT)\b", head):
            self.kind = "privilege"
        elif "pg_extension_config_dump" in head or re.match(r"ALTER EXTENSION\b", head):
            self.kind = "extension_only"

    def text(self, sql=None):
        return "\n".join(self.comments + [sql if sql is not None else self.sql])

    def or_replace(self):
        assert self.kind == "function"
        return Stmt(self.comments, re.sub(r"^CREATE (FUNCTION|PROCEDURE)\b", r"CREATE OR REPLACE \1", self.sql))


def source_files():
    """sql/ files in the order the extension loads them (extension/src/lib.rs)."""
    lib = read(os.path.join(ROOT, "extension", "src", "lib.rs"))
    files = re.findall(r'extension_sql_file!\(\s*"\.\./\.\./(sql/[^"]+)"', lib)
    if not files:
        die("no extension_sql_file! in extension/src/lib.rs")
    return [os.path.join(ROOT, f) for f in files]


def install_statements(version):
    """The statements of a version's install script."""
    snapshot = os.path.join(ROOT, "sql", "released", f"{EXT}--{version}.sql")
    if version == current_version():
        stmts = [s for f in source_files() for s in split(read(f))]
        if os.path.exists(snapshot) and [s.head for s in split(read(snapshot))] != [s.head for s in stmts]:
            die(f"{version} is released, but sql/ no longer builds its snapshot: bump the version in Cargo.toml")
        return stmts
    if not os.path.exists(snapshot):
        die(f"no snapshot of {version}: sql/released/{EXT}--{version}.sql")
    return split(read(snapshot))


def upgrade_statements(old, new):
    """Hand-written part, then the replay of the new version's functions, comments, privileges."""
    hand = os.path.join(ROOT, "sql", "upgrade", f"{EXT}--{old}--{new}.sql")
    if not os.path.exists(hand):
        die(f"no upgrade source sql/upgrade/{EXT}--{old}--{new}.sql (an empty file is fine)")
    out = split(read(hand))
    # Functions of the old version, and the ones the hand-written part created (for an object it
    # creates before the replay, such as an index's function): the replay replaces them.
    existing = {s.identity for s in install_statements(old) + out if s.kind == "function"}
    for s in install_statements(new):
        if s.kind == "function":
            # A function new in this version is created, never replaced: CREATE OR REPLACE would
            # adopt an object someone else may have planted under that name.
            out.append(s.or_replace() if s.identity in existing else s)
        elif s.kind in ("function_comment", "privilege"):
            out.append(s)
    return out


def consecutive(old, new):
    versions = chain()
    if old not in versions or new not in versions or versions.index(new) != versions.index(old) + 1:
        die(f"{old} -> {new} is not a step of the version chain {versions}")


def portable_replacements():
    d = os.path.join(ROOT, "sql", "portable")
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".sql"):
            for s in split(read(os.path.join(d, name))):
                if s.kind != "function":
                    die(f"sql/portable/{name}: only CREATE FUNCTION belongs here, got {s.head[:60]!r}")
                if s.language == "c":
                    die(f"sql/portable/{name}: {s.key} is LANGUAGE c")
                out[s.key] = s
    return out


def portable(stmts, replacements, used, keep_extension_only=False):
    """The portable form of a statement list: C functions swapped, extension-only statements
    dropped (kept for pg_tle, which has the extension machinery)."""
    out = []
    defined = set()  # functions already defined in SQL or PL/pgSQL by an earlier statement
    for s in stmts:
        if s.kind == "extension_only" and not keep_extension_only:
            continue
        if s.kind == "function" and s.language == "c" and s.identity in defined:
            # A native replacement of a function the sources define in PL/pgSQL (sql/native.sql):
            # the portable install keeps the PL/pgSQL one.
            continue
        if s.kind == "function" and s.language != "c":
            defined.add(s.identity)
        if s.kind == "function" and s.language == "c":
            plain_key = s.key
            r = replacements.get(plain_key)
            if r is None:
                die(f"no portable replacement for LANGUAGE c function {plain_key} in sql/portable/")
            used.add(plain_key)
            out.append(r.or_replace() if s.sql.startswith("CREATE OR REPLACE") else r)
            continue
        out.append(s)
    return out


def header(title):
    return [f"-- {title}",
            "-- Generated by scripts/sqlbuild.py from sql/ (see docs/upgrading.md); do not edit.",
            ""]


PSQL_PRELUDE = r"""\set ON_ERROR_STOP on
\if :{?schema}
\else
\echo 'idempotency: name the target schema: psql -v schema=NAME -f FILE'
DO $$ BEGIN RAISE EXCEPTION 'missing -v schema=NAME' USING ERRCODE = '22023'; END $$;
\endif
BEGIN;
"""


def check_block(body):
    """A DO block run with the schema name (as text) bound to %L, through \\gexec."""
    return ("SELECT pg_catalog.format($check$DO $do$\n" + body +
            "\n$do$$check$, :'schema') \\gexec\n")


def schema_check(more):
    """Checks every portable script makes before changing anything; `more` adds its own."""
    return check_block("""DECLARE
    target    oid := (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = %1$L);
    installed text;
BEGIN
    IF pg_catalog.strpos(%1$L, '''') > 0 OR pg_catalog.strpos(%1$L, '"') > 0
       OR pg_catalog.strpos(%1$L, '$') > 0 OR pg_catalog.strpos(%1$L, '\\') > 0 THEN
        RAISE EXCEPTION 'idempotency: schema name %% contains a quote, $ or backslash, which the install cannot use', %1$L
            USING ERRCODE = '3F000';
    END IF;
    IF target IS NULL THEN
        RAISE EXCEPTION 'idempotency: schema %% does not exist; create it first (its owner needs no superuser)', %1$L
            USING ERRCODE = '3F000';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'idempotency' AND e.extnamespace = target) THEN
        RAISE EXCEPTION 'idempotency: schema %% holds the idempotency extension; the portable install needs a schema of its own', %1$L
            USING ERRCODE = '42710';
    END IF;
""" + more + "END")


def exec_stmt(s):
    if TAG in s.sql:
        die(f"statement contains {TAG}")
    comments = "\n".join(s.comments)
    return ((comments + "\n" if comments else "") +
            f"SELECT pg_catalog.replace({TAG}{s.sql}{TAG}, '@extschema@', pg_catalog.quote_ident(:'schema')) \\gexec\n")


def version_stmt(version):
    return [Stmt([], f"CREATE OR REPLACE FUNCTION @extschema@._idem_portable_version() RETURNS text\n"
                     f"    LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
                     f"    SET search_path = pg_catalog, pg_temp\n"
                     f"    AS $fn$ SELECT '{version}'::text $fn$;"),
            Stmt([], "COMMENT ON FUNCTION @extschema@._idem_portable_version() IS\n"
                     "    'Portable install: the idempotency version installed in this schema.';")]


def check_all_used(replacements, used):
    unused = sorted(set(replacements) - used)
    if unused:
        die(f"sql/portable/ replaces functions the extension does not define in C: {unused}")


def cmd_portable(version=None):
    version = version or current_version()
    replacements, used = portable_replacements(), set()
    stmts = portable(install_statements(version), replacements, used)
    if version == current_version():
        # (An older version, built only to test portable upgrades, had fewer C functions.)
        check_all_used(replacements, used)
    out = header(f"idempotency {version}, portable install: no native library, no superuser.")
    out += ["-- Usage: psql -v schema=NAME -f idempotency-portable.sql   (NAME exists; you own it)",
            "-- Installs into that schema in one transaction; fails, changing nothing, if the schema",
            "-- already holds idempotency (portable or the extension).", ""]
    body = PSQL_PRELUDE + schema_check("""    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = target AND c.relname = 'idem_records')
       OR EXISTS (SELECT FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = target AND p.proname = '_idem_portable_version') THEN
        RAISE EXCEPTION 'idempotency: schema %% already holds idempotency; to upgrade it, run the portable upgrade script', %1$L
            USING ERRCODE = '42710';
    END IF;
""")
    sys.stdout.write("\n".join(out) + body + "\n")
    for s in stmts + version_stmt(version):
        sys.stdout.write(exec_stmt(s) + "\n")
    sys.stdout.write("COMMIT;\n")


def cmd_portable_upgrade(old, new):
    consecutive(old, new)
    replacements, used = portable_replacements(), set()
    stmts = portable(upgrade_statements(old, new), replacements, used)
    out = header(f"idempotency portable upgrade {old} -> {new}.")
    out += ["-- Usage: psql -v schema=NAME -f FILE   (NAME holds the portable install of " + old + ")", ""]
    body = PSQL_PRELUDE + schema_check("""    IF NOT EXISTS (SELECT FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = target AND p.proname = '_idem_portable_version') THEN
        RAISE EXCEPTION 'idempotency: schema %% holds no portable install of idempotency', %1$L USING ERRCODE = '42704';
    END IF;
    EXECUTE pg_catalog.format('SELECT %%I._idem_portable_version()', %1$L) INTO installed;
    IF installed IS DISTINCT FROM 'OLD' THEN
        RAISE EXCEPTION 'idempotency: schema %% holds portable idempotency %%; this script upgrades OLD to NEW', %1$L, installed
            USING ERRCODE = '55000';
    END IF;
""".replace("OLD", old).replace("NEW", new))
    sys.stdout.write("\n".join(out) + body + "\n")
    for s in stmts + version_stmt(new):
        sys.stdout.write(exec_stmt(s) + "\n")
    sys.stdout.write("COMMIT;\n")


def cmd_upgrade(old, new):
    consecutive(old, new)
    out = [f"-- idempotency update {old} -> {new}: the hand-written part (sql/upgrade/{EXT}--{old}--{new}.sql),",
           f"-- then every function of {new} replayed. Generated by scripts/sqlbuild.py; do not edit.",
           f"\\echo Use \"ALTER EXTENSION {EXT} UPDATE TO '{new}'\" to load this file. \\quit", ""]
    for s in upgrade_statements(old, new):
        out.append(s.text() + "\n")
    sys.stdout.write("\n".join(out))


def cmd_install_files(dest, current=False):
    versions = chain()
    cur = current_version()
    if current:
        # What pgrx's schema generation writes for this extension: its extension_sql_file!s in
        # load order (every function is declared there by hand), without pgrx's comments.
        with open(os.path.join(dest, f"{EXT}--{cur}.sql"), "w", encoding="utf-8") as f:
            f.write("\n".join(read(path) for path in source_files()))
        control = read(os.path.join(ROOT, "extension", f"{EXT}.control"))
        with open(os.path.join(dest, f"{EXT}.control"), "w", encoding="utf-8") as f:
            f.write(control.replace("@CARGO_VERSION@", cur))
    for v in versions:
        if v != cur:
            with open(os.path.join(dest, f"{EXT}--{v}.sql"), "w", encoding="utf-8") as f:
                f.write(read(os.path.join(ROOT, "sql", "released", f"{EXT}--{v}.sql")))
    for old, new in zip(versions, versions[1:]):
        path = os.path.join(dest, f"{EXT}--{old}--{new}.sql")
        saved = sys.stdout
        with open(path, "w", encoding="utf-8") as f:
            sys.stdout = f
            try:
                cmd_upgrade(old, new)
            finally:
                sys.stdout = saved
        print(path)


def pgtle_body(stmts):
    for s in stmts:
        if "$_pgtle_$" in s.sql:
            die("statement contains $_pgtle_$")
    return "\n\n".join(s.text() for s in stmts)


def cmd_pgtle():
    versions = [v for v in chain() if vkey(v) >= FIRST_PORTABLE]
    replacements = portable_replacements()
    comment = re.search(r"^comment\s*=\s*'(.*)'", read(os.path.join(ROOT, "extension", f"{EXT}.control")), re.M).group(1)
    out = header(f"idempotency {versions[-1]} for pg_tle (trusted languages only): run as a pg_tle admin.")
    out += ["-- NOT TESTED HERE: pg_tle cannot be installed on the build machine. Then, in a database:",
            f"--   CREATE EXTENSION {EXT};", ""]
    # pg_tle keeps the extension machinery, so pg_extension_config_dump stays: only C is swapped.
    def tle(stmts):
        return portable(stmts, replacements, set(), keep_extension_only=True)
    first = versions[0]
    out.append(f"SELECT pgtle.install_extension('{EXT}', '{first}', '{comment}', $_pgtle_$\n"
               f"{pgtle_body(tle(install_statements(first)))}\n$_pgtle_$);\n")
    for old, new in zip(versions, versions[1:]):
        out.append(f"SELECT pgtle.install_update_path('{EXT}', '{old}', '{new}', $_pgtle_$\n"
                   f"{pgtle_body(tle(upgrade_statements(old, new)))}\n$_pgtle_$);\n")
    if len(versions) > 1:
        out.append(f"SELECT pgtle.set_default_version('{EXT}', '{versions[-1]}');\n")
    sys.stdout.write("\n".join(out))


def main(argv):
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "versions" and not args:
        print("\n".join(chain()))
    elif cmd == "upgrade" and len(args) == 2:
        cmd_upgrade(*args)
    elif cmd == "install-files" and len(args) in (1, 2) and args[1:] in ([], ["--current"]):
        cmd_install_files(args[0], current=args[1:] == ["--current"])
    elif cmd == "portable" and len(args) <= 1:
        cmd_portable(*args)
    elif cmd == "portable-upgrade" and len(args) == 2:
        cmd_portable_upgrade(*args)
    elif cmd == "pgtle" and not args:
        cmd_pgtle()
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
