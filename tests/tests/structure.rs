//! The workspace's structure: no module of a crate imports, directly or
//! through others, a module that imports it back, no command-line type or
//! clap derive is used below a crate's command layer, every binary's
//! `main.rs` is the same few lines, and every crate carries its package
//! metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable source folder") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A crate's modules (`a::b` for `src/a/b.rs` or `src/a/b/mod.rs`; the
/// crate roots left out) and their code without tests and comments.
fn modules(krate: &str) -> BTreeMap<String, String> {
    let src = root().join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src").with_extension("");
        let mut name = rel.to_string_lossy().replace('/', "::");
        if let Some(parent) = name.strip_suffix("::mod") {
            name = parent.to_string();
        }
        if name == "lib" || name == "main" || name.starts_with("bin::") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("readable source");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        out.insert(name, code);
    }
    out
}

/// The paths named after `prefix` (`crate::`, `super::`) in `code`,
/// grouped imports (`crate::a::{b, c::d}`) expanded.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let base: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let after = &rest[base.len()..];
        if base.ends_with("::")
            && after.starts_with('{')
            && let Some(end) = after.find('}')
        {
            for item in after[1..end].split(',') {
                let item = item.trim();
                if !item.is_empty() {
                    out.push(format!("{base}{item}"));
                }
            }
        } else {
            out.push(base.trim_end_matches(':').to_string());
        }
    }
    out
}

/// The module a path names: its longest prefix that is a module.
fn module_of(path: &str, names: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|k| parts[..k].join("::"))
        .find(|m| names.contains(m))
}

fn import_graph(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(krate);
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    let mut g = BTreeMap::new();
    for (m, code) in &mods {
        let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
        let mut deps = BTreeSet::new();
        for p in paths_after(code, "crate::") {
            deps.extend(module_of(&p, &names));
        }
        for p in paths_after(code, "super::") {
            let full = if parent.is_empty() {
                p
            } else {
                format!("{parent}::{p}")
            };
            deps.extend(module_of(&full, &names));
        }
        deps.remove(m);
        g.insert(m.clone(), deps);
    }
    g
}

/// The modules on an import cycle, if any.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            match state.get(d) {
                Some(1) => {
                    let from = stack.iter().position(|x| x == d).unwrap_or(0);
                    let mut c = stack[from..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(d, g, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in g.keys() {
        if !state.contains_key(m)
            && let Some(c) = visit(m, g, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    for krate in [
        "traces",
        "replay",
        "loadgen",
        "calibrate",
        "mockserver",
        "loop",
        "python",
    ] {
        let g = import_graph(krate);
        if let Some(c) = cycle(&g) {
            panic!("{krate}: import cycle {}", c.join(" -> "));
        }
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycle(&g).map(|c| c.len()), Some(4));
    g.insert("c".to_string(), BTreeSet::new());
    assert_eq!(cycle(&g), None);
    let names: BTreeSet<String> = ["latency", "latency::arch"].map(String::from).into();
    let p = paths_after("use crate::latency::{arch::X, Model};", "crate::");
    let mods: BTreeSet<_> = p.iter().filter_map(|x| module_of(x, &names)).collect();
    assert_eq!(mods, ["latency", "latency::arch"].map(String::from).into());
}

/// Each crate's command layer: the modules that know the command line
/// (the crate roots, left out of [`modules`], dispatch to them).
const COMMAND_LAYER: [(&str, &[&str]); 7] = [
    ("traces", &[]),
    ("replay", &["commands"]),
    ("loadgen", &["cli"]),
    ("calibrate", &["cli", "run"]),
    ("mockserver", &["cli"]),
    ("loop", &[]),
    // (The Python bindings are one crate root: a command layer.)
    ("python", &[]),
];

#[test]
fn no_command_line_type_is_used_below_the_command_layer() {
    for (krate, layer) in COMMAND_LAYER {
        for (m, code) in modules(krate) {
            let top = m.split("::").next().unwrap_or_default();
            if layer.contains(&top) {
                continue;
            }
            assert!(
                !code.contains("cli::"),
                "{krate}::{m} uses a command-line type"
            );
            assert!(
                !code.contains("clap"),
                "{krate}::{m} derives or uses clap below the command layer"
            );
        }
    }
}

#[test]
fn every_binary_has_the_same_thin_main() {
    // Compared without layout (rustfmt wraps a longer crate name).
    let main = |k: &str| {
        std::fs::read_to_string(root().join(k).join("src/main.rs"))
            .expect("a main.rs")
            .replace(&format!("blis_{k}"), "blis_X")
            .split_whitespace()
            .collect::<String>()
            .replace(",)", ")")
    };
    let first = main("loadgen");
    for k in ["calibrate", "replay", "mockserver", "loop"] {
        assert_eq!(main(k), first, "{k}/src/main.rs differs from loadgen's");
    }
    assert!(first.len() < 400, "{first}");
}

/// Every crate of the workspace carries what a package needs: a
/// description, a README that exists, keywords and categories, the
/// workspace's licence (Apache-2.0, whose text is the root's LICENSE).
#[test]
fn every_crate_carries_its_package_metadata() {
    let workspace = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        workspace.contains("license = \"Apache-2.0\""),
        "workspace licence"
    );
    let licence = std::fs::read_to_string(root().join("LICENSE")).expect("a LICENSE file");
    assert!(
        licence.contains("Apache License") && licence.contains("Version 2.0, January 2004"),
        "LICENSE is not the Apache-2.0 text"
    );
    let members = workspace
        .split("members = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .expect("workspace members");
    let crates: Vec<&str> = members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .collect();
    assert!(crates.len() >= 8, "{crates:?}");
    for k in crates {
        let manifest = std::fs::read_to_string(root().join(k).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{k}/Cargo.toml: {e}"));
        let package = manifest.split("\n[").next().unwrap_or_default();
        let value = |key: &str| {
            package
                .lines()
                .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix('='))
                .map(str::trim)
                .unwrap_or_else(|| panic!("{k}/Cargo.toml has no `{key}`"))
        };
        assert!(value("description").len() > 20, "{k}: a description");
        let readme = value("readme").trim_matches('"');
        assert!(
            root().join(k).join(readme).is_file(),
            "{k}: readme {readme} is not a file"
        );
        assert!(value("keywords").contains("\","), "{k}: keywords");
        assert!(value("categories").contains('"'), "{k}: categories");
        assert!(package.contains("license.workspace = true"), "{k}: licence");
    }
}
