"""The PGXN checks of the package layer (xtask/src/layers/package/pgxn.rs).

    python3 tests/package/pgxn/check.py SCHEMA META.json ZIP VERSION

META.json is valid against SCHEMA (the PGXN Meta Spec 1.0, tests/package/pgxn/meta.schema.json);
each deliberately broken copy of it is not (the validation is known to reject); its version and
every extension's are VERSION (the workspace's); the distribution ZIP holds it at its root
directory together with every file it names. Prints one line per check, `ok NAME` or
`FAILED NAME: why`; exits 1 when any failed.
"""

import copy
import json
import sys
import zipfile

import jsonschema

# Each breaks one rule of the spec.
BROKEN = {
    "no provides": lambda m: m.pop("provides"),
    "no maintainer": lambda m: m.pop("maintainer"),
    "a version that is not SemVer": lambda m: m.__setitem__("version", "0.7"),
    "a license the spec does not name": lambda m: m.__setitem__("license", "wtfpl"),
    "an extension without its version": lambda m: next(iter(m["provides"].values())).pop("version"),
    "an unknown top-level key": lambda m: m.__setitem__("homepage", "https://example.org"),
    "meta-spec version 2.0.0": lambda m: m["meta-spec"].__setitem__("version", "2.0.0"),
    "a prerequisite version that is no range": lambda m: m["prereqs"]["runtime"]["requires"].__setitem__("PostgreSQL", "fourteen"),
}


def main(schema_path, meta_path, zip_path, version):
    failed = 0

    def check(name, why):
        nonlocal failed
        if why:
            failed += 1
            print(f"FAILED {name}: {why}")
        else:
            print(f"ok {name}")

    with open(schema_path, encoding="utf-8") as f:
        validator = jsonschema.Draft202012Validator(json.load(f))
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(meta)]
    check("META.json is valid against the PGXN Meta Spec 1.0", "; ".join(errors))
    for what, breaks in BROKEN.items():
        broken = copy.deepcopy(meta)
        breaks(broken)
        check(f"META.json with {what} is rejected", "" if list(validator.iter_errors(broken)) else "accepted")

    wrong = {k: v["version"] for k, v in meta.get("provides", {}).items() if v.get("version") != version}
    check(f"META.json's version and every extension's are {version} (Cargo.toml)", "" if meta.get("version") == version and not wrong else f"version {meta.get('version')}, extensions {wrong}")

    top = f"{meta.get('name')}-{version}/"
    with zipfile.ZipFile(zip_path) as z:
        names = set(z.namelist())
        inside = json.loads(z.read(top + "META.json")) if top + "META.json" in names else None
    check(f"the distribution holds this META.json at {top}", "" if inside == meta else "missing or different")
    named = [v[k] for v in meta.get("provides", {}).values() for k in ("file", "docfile") if k in v]
    missing = [p for p in named + ["Cargo.toml", "extension/Cargo.toml", "README.md"] if top + p not in names]
    check("the distribution holds the source and every file META.json names", ", ".join(missing))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
