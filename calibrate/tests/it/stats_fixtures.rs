use blis_calibrate::stats::{ks_2samp, wasserstein};
use serde_json::Value;

fn fixture() -> Value {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ks_scipy.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn nums(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The samples of a formula case, as the fixture script computes them.
fn formula(f: &Value) -> Vec<f64> {
    let f = f.as_array().unwrap();
    let n = f[0].as_u64().unwrap();
    let (mul, add, m) = (
        f[1].as_u64().unwrap() as u128,
        f[2].as_u64().unwrap() as u128,
        f[3].as_u64().unwrap() as u128,
    );
    let shift = f[4].as_f64().unwrap();
    (0..n as u128)
        .map(|i| ((i * mul + add) % m) as f64 / m as f64 + shift)
        .collect()
}

fn close(ours: f64, theirs: f64, rel: f64, abs: f64) -> bool {
    (ours - theirs).abs() <= abs.max(rel * theirs.abs())
}

#[test]
fn ks_matches_scipy_exact_and_auto() {
    let f = fixture();
    let mut checked = 0;
    for c in f["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let (a, b) = match c.get("formula") {
            Some(fm) => (formula(&fm["a"]), formula(&fm["b"])),
            None => (nums(&c["a"]), nums(&c["b"])),
        };
        let ours = ks_2samp(&a, &b);
        for method in ["ks_exact", "ks_auto"] {
            let Some(t) = c.get(method) else { continue };
            let (d, p) = (t["d"].as_f64().unwrap(), t["p"].as_f64().unwrap());
            assert!(
                close(ours.d, d, 1e-12, 1e-12),
                "{name}: D {} vs scipy {d}",
                ours.d
            );
            if ours.exact {
                // Both exact: the same number up to rounding.
                if method == "ks_exact"
                    || c["n1"].as_u64().unwrap().max(c["n2"].as_u64().unwrap()) <= 10_000
                {
                    assert!(
                        close(ours.p, p, 1e-9, 1e-14),
                        "{name}: p {} vs scipy {method} {p}",
                        ours.p
                    );
                }
            } else {
                // Our asymptotic (Kolmogorov with Stephens' correction) vs
                // scipy's (the exact one-sample distribution at n = en).
                assert!(
                    close(ours.p, p, 0.02, 1e-3),
                    "{name}: p {} vs scipy {method} {p}",
                    ours.p
                );
            }
            checked += 1;
        }
        let w = c["wasserstein"].as_f64().unwrap();
        assert!(
            close(wasserstein(&a, &b), w, 1e-10, 1e-12),
            "{name}: W {} vs {w}",
            wasserstein(&a, &b)
        );
    }
    assert!(checked >= 25, "{checked}");
}
