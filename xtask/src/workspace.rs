//! The workspace's crates, read from the manifests (the root Cargo.toml's `members`, each
//! member's `[package]` and `[features]`): the one reader for what covers every crate (the
//! import check, the feature table's completeness, the dry run's clean-up of cargo's unpacked
//! copies), so a crate added to the workspace is covered by each.

use std::path::{Path, PathBuf};

/// A member of the workspace.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// Its package name.
    pub(crate) name: String,
    /// Its folder (read by the import check, a unit test).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) dir: PathBuf,
    /// Whether `cargo publish` takes it (no `publish = false`).
    pub(crate) publish: bool,
    /// The features its `[features]` declares (`default` included; read by the feature
    /// table's unit test).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) features: Vec<String>,
}

/// The members of the workspace whose root is `root`, in the order the root Cargo.toml lists
/// them.
pub(crate) fn members(root: &Path) -> Vec<Member> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the root Cargo.toml");
    let list = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .and_then(|m| m.split(']').next())
        .expect("[workspace] members = [...] on one line");
    list.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()).map(|m| member(&root.join(m))).collect()
}

/// The member in `dir`.
fn member(dir: &Path) -> Member {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_else(|e| panic!("{}/Cargo.toml: {e}", dir.display()));
    let (mut section, mut name, mut publish, mut features) = (String::new(), None, true, Vec::new());
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_owned();
        } else if let Some((key, value)) = line.split_once('=') {
            let (key, value) = (key.trim(), value.trim());
            match section.as_str() {
                "[package]" if key == "name" => name = Some(value.trim_matches('"').to_owned()),
                "[package]" if key == "publish" => publish = value != "false",
                "[features]" => features.push(key.to_owned()),
                _ => {}
            }
        }
    }
    let name = name.unwrap_or_else(|| panic!("{}/Cargo.toml names no package", dir.display()));
    Member { name, dir: dir.to_owned(), publish, features }
}

#[cfg(test)]
mod tests {
    use super::members;
    use std::path::Path;

    #[test]
    fn the_members_are_read() {
        let all = members(Path::new(".."));
        let client = all.iter().find(|m| m.name == "idempotency-client").expect("the client");
        assert!(client.publish && client.features.iter().any(|f| f == "postgres") && client.dir.ends_with("client"), "{client:?}");
        let xtask = all.iter().find(|m| m.name == "xtask").expect("xtask");
        assert!(!xtask.publish && xtask.features.is_empty(), "{xtask:?}");
    }
}
