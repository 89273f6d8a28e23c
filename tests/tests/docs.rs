//! The README and the scripts a new user runs build the tools one way:
//! the whole workspace (`cargo build --release`, or `cargo run --bin`),
//! then the built binaries. A `-p` package selection unifies the
//! dependencies' features differently and silently recompiles the shared
//! crates (minutes on 2 cores), so no command a user copies may make one.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Files whose commands users copy or run.
fn user_facing() -> Vec<PathBuf> {
    let r = root();
    let mut files = vec![
        r.join("README.md"),
        r.join("examples/policy_search/grid.py"),
    ];
    for dir in ["examples/workflows", "loadgen/benches", "replay/benches"] {
        for e in std::fs::read_dir(r.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "sh") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn no_user_command_builds_a_package_selection() {
    let mut bad = Vec::new();
    for f in user_facing() {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let builds = line.contains("cargo run") || line.contains("cargo build");
            // Examples and benchmarks are developer commands: they build
            // their own targets anyway.
            let dev = line.contains("--example") || line.contains("cargo bench");
            if builds && !dev && line.contains(" -p ") && !line.contains("`cargo run -p blis-X`") {
                bad.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "package selections:\n{}", bad.join("\n"));
}

#[test]
fn the_readme_has_the_two_commands_and_the_scripts_use_built_binaries() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains("```sh\ncargo build --release && target/release/blis-loop\n```"));
    assert!(readme.contains("```sh\ncargo test --workspace\n```"));
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l.trim() == "cargo test --workspace"));
    for f in user_facing() {
        if f.parent()
            .is_some_and(|d| d.ends_with("examples/workflows"))
            && !f.ends_with("bin.sh")
        {
            let text = std::fs::read_to_string(&f).unwrap();
            assert!(
                text.contains("source examples/workflows/bin.sh"),
                "{} builds through bin.sh",
                f.display()
            );
            assert!(
                !text.contains("cargo "),
                "{} calls the built binaries",
                f.display()
            );
        }
    }
}
