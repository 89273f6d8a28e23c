//! The benchmark scripts' own arithmetic, checked without the peers they
//! race: `loadgen/benches/race/race.py --self-test` runs its schedule-error,
//! achieved-rate and accuracy join on made-up served logs whose answers
//! are known (a late request, a late first request, ids or send order, a
//! lost request).

use std::path::Path;
use std::process::Command;

#[test]
fn the_race_analysis_gives_the_known_answers() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../loadgen/benches/race/race.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--self-test")
        .output()
        .expect("python3 runs (the race and CI's manifest check use it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("self-test: ok"));
}
