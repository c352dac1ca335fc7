//! Every relative link in the repository's Markdown resolves, and the README stays within its line bound.
//!
//! Walks every `*.md` file (skipping `target/` and `.git/`), finds inline links and images
//! (`[text](path)`, `[text](path#anchor)`, `![alt](path)`) and reference definitions
//! (`[label]: path`) outside code, and checks that each relative target exists, relative to the
//! Markdown file (or to the repository root for `/path`), without leaving the repository. An
//! anchor into a Markdown file (`#anchor` or `file.md#anchor`) must name one of its headings, as
//! GitHub derives heading ids. Links with a scheme (`https:`, `mailto:`) are not checked.
//! Std only: no server, no network.

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// One broken link: where it is and why.
#[derive(Debug, PartialEq, Eq)]
struct Broken {
    file: PathBuf,
    line: usize,
    target: String,
    reason: String,
}

/// The repository root: the parent of this crate's directory.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives one level below the repository root")
        .to_path_buf()
}

/// Every `*.md` file under `dir`, skipping `target/` and `.git/`, in a stable order. Symbolic
/// links to directories are not followed.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<(PathBuf, bool)> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| {
            let entry = entry.expect("directory entry");
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            (entry.path(), is_dir)
        })
        .collect();
    entries.sort();
    for (path, is_dir) in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if is_dir {
            if name != "target" && name != ".git" {
                markdown_files(&path, out);
            }
        } else if is_markdown(&path) {
            out.push(path);
        }
    }
}

/// True for `*.md` (any case).
fn is_markdown(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("md"))
}

/// The lines of `text` outside fenced code blocks, with inline code spans blanked out; each
/// with its 1-based line number.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
        let is_fence = marker.len() >= 3 && marker.chars().all(|c| c == marker.chars().next().unwrap());
        match &fence {
            Some(open) => {
                if is_fence && marker.starts_with(open.as_str()) && trimmed[marker.len()..].trim().is_empty() {
                    fence = None;
                }
            }
            None if is_fence => fence = Some(marker),
            None => out.push((i + 1, blank_code_spans(line))),
        }
    }
    out
}

/// `line` with the contents of its inline code spans replaced by spaces.
fn blank_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run has exactly the same length.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let r = chars[j..].iter().take_while(|&&c| c == '`').count();
                if r == run {
                    close = Some(j);
                    break;
                }
                j += r;
            } else {
                j += 1;
            }
        }
        if let Some(j) = close {
            out.extend(std::iter::repeat_n(' ', j + run - i));
            i = j + run;
        } else {
            // An unmatched run is literal text.
            out.extend(&chars[i..i + run]);
            i += run;
        }
    }
    out
}

/// The link destinations on one line of prose: inline links and images, and reference
/// definitions.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let trimmed = line.trim_start();
    // `[label]: destination` (a reference definition).
    if let Some(rest) = trimmed.strip_prefix('[') {
        if let Some(end) = rest.find("]:") {
            if !rest[..end].is_empty() && !rest[..end].contains('[') {
                out.push(destination(&rest[end + 2..]));
                return out;
            }
        }
    }
    // `](destination)`: the end of an inline link's text and the start of its destination.
    let mut from = 0;
    while let Some(pos) = line[from..].find("](") {
        let start = from + pos + 2;
        let mut depth = 0usize;
        let mut end = None;
        for (k, c) in line[start..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(start + k);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        match end {
            Some(end) => {
                out.push(destination(&line[start..end]));
                from = end + 1;
            }
            None => break,
        }
    }
    out
}

/// A destination without its optional title and angle brackets.
fn destination(raw: &str) -> String {
    let raw = raw.trim();
    if let Some(inner) = raw.strip_prefix('<') {
        return inner.split('>').next().unwrap_or("").to_string();
    }
    raw.split_whitespace().next().unwrap_or("").to_string()
}

/// `%20` and friends decoded; anything malformed is kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// True for `https:`, `mailto:` and any other URL with a scheme.
fn has_scheme(target: &str) -> bool {
    match target.find(':') {
        Some(colon) => {
            let scheme = &target[..colon];
            !scheme.is_empty()
                && scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

/// The anchors GitHub gives the headings of a Markdown text (lowercased; punctuation other than
/// `-` and `_` dropped; spaces become `-`; repeats get `-1`, `-2`, ...), plus explicit
/// `id="..."` / `name="..."` anchors.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashSet<String> = HashSet::new();
    for (_, line) in prose_lines_keeping_code(text) {
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            let title = trimmed[hashes..].trim().trim_end_matches('#').trim();
            let base: String = title
                .to_lowercase()
                .chars()
                .filter(|&c| c.is_alphanumeric() || c == ' ' || c == '-' || c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            let mut slug = base.clone();
            let mut n = 0;
            while seen.contains(&slug) {
                n += 1;
                slug = format!("{base}-{n}");
            }
            seen.insert(slug);
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line.as_str();
            while let Some(pos) = rest.find(attr) {
                rest = &rest[pos + attr.len()..];
                if let Some(end) = rest.find('"') {
                    seen.insert(rest[..end].to_string());
                }
            }
        }
    }
    seen
}

/// Like [`prose_lines`], but keeping inline code (heading ids are made from the heading's text,
/// code spans included, without the backticks).
fn prose_lines_keeping_code(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    prose_lines(text).into_iter().map(|(n, _)| (n, lines[n - 1].to_string())).collect()
}

/// Lexically normalised `path` (`.` and `..` resolved), or None if `..` climbs above its start.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    Some(out)
}

/// Every broken relative link in the Markdown files under `root`.
fn broken_links(root: &Path) -> Vec<Broken> {
    let mut files = Vec::new();
    markdown_files(root, &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let rel_file = file.strip_prefix(root).unwrap_or(file).to_path_buf();
        for (line, prose) in prose_lines(&text) {
            for target in link_targets(&prose) {
                if target.is_empty() || has_scheme(&target) {
                    continue;
                }
                let (path_part, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let path_part = percent_decode(path_part.split('?').next().unwrap_or(""));
                let report = |reason: String| Broken {
                    file: rel_file.clone(),
                    line,
                    target: target.clone(),
                    reason,
                };
                // The file the link points at, relative to the root.
                let resolved = if path_part.is_empty() {
                    Some(rel_file.clone())
                } else if let Some(from_root) = path_part.strip_prefix('/') {
                    normalise(Path::new(from_root))
                } else {
                    normalise(&rel_file.parent().unwrap_or(Path::new("")).join(&path_part))
                };
                let Some(resolved) = resolved else {
                    broken.push(report("leaves the repository".into()));
                    continue;
                };
                let on_disk = root.join(&resolved);
                if !on_disk.exists() {
                    broken.push(report(format!("{} does not exist", resolved.display())));
                    continue;
                }
                if let Some(anchor) = anchor.filter(|a| !a.is_empty()) {
                    if is_markdown(&on_disk) && on_disk.is_file() {
                        let target_text = fs::read_to_string(&on_disk).unwrap_or_default();
                        let anchor = percent_decode(anchor).to_lowercase();
                        if !anchors(&target_text).contains(&anchor) {
                            broken.push(report(format!("no heading in {} has the anchor #{anchor}", resolved.display())));
                        }
                    }
                }
            }
        }
    }
    broken
}

fn describe(broken: &[Broken]) -> String {
    broken
        .iter()
        .map(|b| format!("  {}:{}: ({}) {}", b.file.display(), b.line, b.target, b.reason))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_relative_markdown_link_resolves() {
    let root = repo_root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "found no README.md under {}: the walk is looking in the wrong place",
        root.display()
    );
    let broken = broken_links(&root);
    assert!(broken.is_empty(), "{} broken Markdown link(s):\n{}", broken.len(), describe(&broken));
}

/// The checker itself: in a scratch tree, exactly the broken links are reported.
#[test]
fn the_checker_reports_exactly_the_broken_links() {
    let dir = std::env::temp_dir().join(format!("idem-markdown-links-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("docs")).unwrap();
    fs::create_dir_all(dir.join("target")).unwrap();
    fs::write(dir.join("docs/guide.md"), "# Guide\n\n## Two `words` here\n\nSee [back](../README.md#top-title).\n").unwrap();
    fs::write(dir.join("target/ignored.md"), "[skipped](nowhere.md)\n").unwrap();
    fs::write(
        dir.join("README.md"),
        concat!(
            "# Top title\n",
            "[ok](docs/guide.md) and ![img](docs/guide.md) and [web](https://example.com/x.md)\n",
            "[anchor ok](docs/guide.md#two-words-here) [self](#top-title) [mail](mailto:a@b.c)\n",
            "[missing](docs/missing.md)\n",
            "[bad anchor](docs/guide.md#no-such-heading) [bad self](#nope)\n",
            "`[in code](nowhere.md)`\n",
            "```\n[in a fence](nowhere.md)\n```\n",
            "[escape](../../outside.md)\n",
            "[ref]: docs/absent.md\n",
        ),
    )
    .unwrap();

    let found: Vec<(usize, String)> = broken_links(&dir).into_iter().map(|b| (b.line, b.target)).collect();
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        vec![
            (4, "docs/missing.md".to_string()),
            (5, "docs/guide.md#no-such-heading".to_string()),
            (5, "#nope".to_string()),
            (10, "../../outside.md".to_string()),
            (11, "docs/absent.md".to_string()),
        ]
    );
}

/// The front page stays readable in five minutes (issue 33): at most this many lines.
const README_LINES: usize = 220;

#[test]
fn the_readme_stays_within_its_bound() {
    let text = fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(lines <= README_LINES, "README.md has {lines} lines, more than {README_LINES}: move detail to docs/");
}
