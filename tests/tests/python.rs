//! The Python package (`python/`): built as the abi3 wheel users install,
//! installed in a virtual environment, and its pytest suite run against the
//! command line (`python/tests`). Part of the README's test command
//! (`cargo test --workspace -- --include-ignored`); ignored by a plain
//! `cargo test` because it needs python3 with `venv`, PyPI
//! (`python/requirements-test.txt`: maturin, pyarrow, pytest, pandas; Ray,
//! OpenEvolve and GEPA for the policy searches' tests) and a release build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root")
}

/// Runs `cmd` in the workspace root, failing the test with its output.
fn run(what: &str, cmd: &mut Command) {
    let out = cmd
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "builds the Python wheel and runs its pytest suite: needs python3 with venv, PyPI and a release build"]
fn the_python_package_passes_its_pytest_suite() {
    let root = root();
    // Its own target directory: a build of the workspace's target directory
    // would wait for the lock the running `cargo test` holds.
    let target = root.join("target").join("python");
    let venv =
        std::env::var_os("BLIS_PYTHON_VENV").map_or_else(|| target.join("venv"), PathBuf::from);
    let py = venv.join("bin").join("python");
    if !py.exists() {
        run(
            "python3 -m venv",
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
        );
    }
    run(
        "pip install -r python/requirements-test.txt",
        Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
            "python/requirements-test.txt",
        ]),
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(
        "cargo build --release (the command line the suite compares with, the mock as an LLM)",
        Command::new(&cargo)
            .args([
                "build",
                "-q",
                "--release",
                "--bin",
                "blis-replay",
                "--bin",
                "blis-mockserver",
            ])
            .env("CARGO_TARGET_DIR", &target),
    );
    let wheels = target.join("wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    run(
        "maturin build",
        Command::new(venv.join("bin").join("maturin"))
            .args(["build", "-q", "--release", "-m", "python/Cargo.toml", "-o"])
            .arg(&wheels)
            .env("CARGO_TARGET_DIR", &target),
    );
    let wheel = std::fs::read_dir(&wheels)
        .expect("the wheel folder")
        .map(|e| e.expect("an entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("maturin wrote a wheel");
    run(
        "pip install the wheel",
        Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(["--force-reinstall", "--no-deps"])
            .arg(&wheel),
    );
    run(
        "pytest python/tests",
        Command::new(&py)
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "python/tests",
            ])
            .env(
                "BLIS_REPLAY_BIN",
                target.join("release").join("blis-replay"),
            )
            .env(
                "BLIS_MOCKSERVER_BIN",
                target.join("release").join("blis-mockserver"),
            ),
    );
}
