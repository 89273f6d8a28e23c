use std::path::PathBuf;

/// The read-only `shared/` folder beside the checkout.
pub fn shared() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    assert!(
        p.join("servegen").exists(),
        "shared data not found at {} (the checkout's sibling folder `shared`)",
        p.display()
    );
    p
}

/// A fresh temporary folder.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary folder")
}
