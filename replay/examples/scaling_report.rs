//! The table, fitted exponents and log-log plot of `replay/benches/scaling.sh`.
//!
//! `cargo run --release --example scaling_report -- RUNS.tsv OUT [NOTE]` reads the
//! script's runs (`model requests instances run wall_s peak_kb`, tab
//! separated, a header line) and writes `OUT.md` (median wall time and
//! peak memory per case, and per latency model the least-squares fit of
//! `log t = a + b·log requests + c·log instances` on the cases of at least
//! 10,000 requests, where a process's fixed start-up cost no longer
//! dominates) and `OUT.svg` (wall time against requests, one line per
//! latency model and cluster size, both axes logarithmic). `NOTE` (when and
//! where it was measured) heads `OUT.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result, bail};
use plotters::prelude::*;

/// (latency model, requests, instances) → (wall times s, peak memory KB).
type Cases = BTreeMap<(String, u64, u64), (Vec<f64>, Vec<f64>)>;

fn read(path: &str) -> Result<Cases> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let mut cases = Cases::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 6 {
            bail!("{path}:{}: expected 6 tab-separated fields", i + 1);
        }
        let num = |k: usize| -> Result<f64> {
            f[k].trim()
                .parse::<f64>()
                .with_context(|| format!("{path}:{}: field {} is not a number", i + 1, k + 1))
        };
        let key = (f[0].to_string(), num(1)? as u64, num(2)? as u64);
        let e = cases.entry(key).or_default();
        e.0.push(num(4)?);
        e.1.push(num(5)?);
    }
    Ok(cases)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Least squares of `y = a + b·x1 + c·x2`; returns `(b, c)`, or `None` when
/// the points do not determine them.
fn fit_two(points: &[(f64, f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 3 {
        return None;
    }
    let (m1, m2, my) = points.iter().fold((0.0, 0.0, 0.0), |acc, p| {
        (acc.0 + p.0 / n, acc.1 + p.1 / n, acc.2 + p.2 / n)
    });
    let (mut s11, mut s22, mut s12, mut s1y, mut s2y) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x1, x2, y) in points {
        let (d1, d2, dy) = (x1 - m1, x2 - m2, y - my);
        s11 += d1 * d1;
        s22 += d2 * d2;
        s12 += d1 * d2;
        s1y += d1 * dy;
        s2y += d2 * dy;
    }
    let det = s11 * s22 - s12 * s12;
    if det.abs() < 1e-12 {
        return None;
    }
    Some(((s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det))
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1000 && n % 1000 == 0 => format!("{}K", n / 1000),
        n => n.to_string(),
    }
}

fn markdown(cases: &Cases, note: &str) -> String {
    let mut md = String::from(
        "# How the replay scales\n\nWall time and peak resident memory of `blis-replay run` through the CLI with default outputs (trace, per-token ITL, metrics, summary) on the bench race workload (Poisson arrivals, Gaussian 512±256 prompt and output tokens) at 22 req/s per instance, so that every instance carries the same load whatever the cluster size; Qwen2.5-7B on an H100, TP 1, 61,048 KV blocks per instance, round-robin routing.\n\n![wall time against requests, log-log](scaling.svg)\n\n",
    );
    if !note.is_empty() {
        let _ = writeln!(md, "{note}\n");
    }
    let models: Vec<&String> = {
        let mut m: Vec<&String> = cases.keys().map(|k| &k.0).collect();
        m.dedup();
        m
    };
    let sizes: Vec<u64> = {
        let mut s: Vec<u64> = cases.keys().map(|k| k.1).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let insts: Vec<u64> = {
        let mut s: Vec<u64> = cases.keys().map(|k| k.2).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    for model in &models {
        let _ = writeln!(
            md,
            "**{model}**: median wall time, s (peak memory, MB), by requests and instances\n"
        );
        let _ = write!(md, "| requests |");
        for i in &insts {
            let _ = write!(md, " × {i} |");
        }
        let _ = write!(md, "\n|---:|");
        for _ in &insts {
            let _ = write!(md, "---:|");
        }
        md.push('\n');
        for n in &sizes {
            let _ = write!(md, "| {} |", human(*n));
            for i in &insts {
                match cases.get(&((*model).clone(), *n, *i)) {
                    Some((t, m)) => {
                        let _ = write!(md, " {:.3} ({:.0}) |", median(t), median(m) / 1024.0);
                    }
                    None => md.push_str(" — |"),
                }
            }
            md.push('\n');
        }
        let pts = |mem: bool| -> Vec<(f64, f64, f64)> {
            cases
                .iter()
                .filter(|(k, _)| &&k.0 == model && k.1 >= 10_000)
                .map(|(k, (t, m))| {
                    let y = if mem { median(m) } else { median(t) };
                    ((k.1 as f64).ln(), (k.2 as f64).ln(), y.ln())
                })
                .collect()
        };
        let fmt = |f: Option<(f64, f64)>| match f {
            Some((b, c)) => format!("requests^{b:.2} × instances^{c:.2}"),
            None => "not determined (too few cases)".to_string(),
        };
        let _ = writeln!(
            md,
            "\nFitted on the cases of at least 10K requests (least squares in logs): wall time ∝ {}; peak memory ∝ {}.\n",
            fmt(fit_two(&pts(false))),
            fmt(fit_two(&pts(true))),
        );
    }
    md
}

fn plot(cases: &Cases, path: &str) -> Result<()> {
    let (mut tmin, mut tmax) = (f64::INFINITY, 0.0f64);
    let (mut nmin, mut nmax) = (u64::MAX, 0u64);
    for (k, (t, _)) in cases {
        let m = median(t);
        tmin = tmin.min(m);
        tmax = tmax.max(m);
        nmin = nmin.min(k.1);
        nmax = nmax.max(k.1);
    }
    if cases.is_empty() {
        bail!("no runs to plot");
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "blis-replay: wall time against requests (22 req/s per instance)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            ((nmin as f64) * 0.8..(nmax as f64) * 1.25).log_scale(),
            (tmin * 0.8..tmax * 1.25).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("requests")
        .y_desc("wall time, s")
        .x_label_formatter(&|x| human(x.round() as u64))
        .y_label_formatter(&|y| format!("{y:.3}"))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()?;
    let mut series: BTreeMap<(String, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for (k, (t, _)) in cases {
        series
            .entry((k.0.clone(), k.2))
            .or_default()
            .push((k.1 as f64, median(t)));
    }
    // One colour per cluster size; the first latency model solid, the
    // others dashed.
    let mut sizes: Vec<u64> = series.keys().map(|k| k.1).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let first_model = series
        .keys()
        .next()
        .map(|k| k.0.clone())
        .unwrap_or_default();
    for ((model, inst), pts) in &series {
        let idx = sizes.iter().position(|s| s == inst).unwrap_or(0);
        let color = Palette99::pick(idx).to_rgba();
        let solid = *model == first_model;
        let label = format!(
            "{model}, {inst} instance{}",
            if *inst == 1 { "" } else { "s" }
        );
        let style = color.stroke_width(2);
        if solid {
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        } else {
            chart
                .draw_series(DashedLineSeries::new(pts.iter().copied(), 6, 4, style))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 6, y)], style));
        }
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (tsv, out, note) = match args.as_slice() {
        [_, tsv, out] => (tsv, out, ""),
        [_, tsv, out, note] => (tsv, out, note.as_str()),
        _ => bail!("usage: scaling_report RUNS.tsv OUT [NOTE] (writes OUT.md and OUT.svg)"),
    };
    let cases = read(tsv)?;
    let md = markdown(&cases, note);
    std::fs::write(format!("{out}.md"), &md).with_context(|| format!("writing {out}.md"))?;
    plot(&cases, &format!("{out}.svg"))?;
    print!("{md}");
    Ok(())
}
