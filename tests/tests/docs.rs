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
    for e in std::fs::read_dir(r.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
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
    assert!(readme.contains("```sh\ncargo test --workspace -- --include-ignored\n```"));
    // .ci/run runs it (the real-server test or the Python package's left
    // out, and said so, only when llama.cpp's server or the Python test
    // tools cannot be installed).
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(
        ci.lines()
            .any(|l| l.trim() == "cargo test --workspace -- --include-ignored \"${skips[@]}\"")
    );
    for test in [
        "the_loop_predicts_a_real_llama_cpp_server",
        "the_python_package_passes_its_pytest_suite",
    ] {
        assert!(
            ci.contains(&format!("skips+=(--skip {test})")),
            "{test}: skipped only with a SKIPPED line"
        );
    }
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

/// The README stays a front page (at most 200 lines); the book's table of
/// contents lists every page of `docs/`, and every relative link of the
/// README and the book points at a file that exists.
#[test]
fn the_readme_is_short_and_the_book_has_no_broken_links() {
    let r = root();
    let readme = std::fs::read_to_string(r.join("README.md")).unwrap();
    let n = readme.lines().count();
    assert!(n <= 200, "README.md has {n} lines");
    let summary = std::fs::read_to_string(r.join("docs/SUMMARY.md")).unwrap();
    let mut pages = Vec::new();
    for e in std::fs::read_dir(r.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") && !p.ends_with("SUMMARY.md") {
            pages.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    pages.sort();
    let unlisted: Vec<&String> = pages
        .iter()
        .filter(|p| !summary.contains(&format!("]({p})")))
        .collect();
    assert!(
        unlisted.is_empty(),
        "pages not in docs/SUMMARY.md: {unlisted:?}"
    );
    let mut broken = Vec::new();
    let mut files = vec![r.join("README.md")];
    files.extend(pages.iter().map(|p| r.join("docs").join(p)));
    files.push(r.join("docs/SUMMARY.md"));
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let dir = f.parent().unwrap();
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                let tail = &rest[at + 2..];
                let Some(end) = tail.find(')') else { break };
                let target = &tail[..end];
                rest = &tail[end..];
                if target.contains("://")
                    || target.starts_with('#')
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                let path = target.split('#').next().unwrap();
                if !dir.join(path).exists() {
                    broken.push(format!("{}:{}: {target}", f.display(), i + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
