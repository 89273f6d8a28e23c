//! The self-contained HTML report: the JSON report's figures in tables and
//! inline SVG plots (plotters), laid out by a minijinja template fed the
//! same `Serialize` report as the JSON.
//!
//! Plots: per metric, the CDFs of both sides overlaid, a QQ plot and a
//! per-request real-vs-sim scatter; the server time series overlaid.

use plotters::prelude::*;
use serde::Serialize;

use crate::compare::Comparison;

const W: u32 = 520;
const H: u32 = 340;
const REAL: RGBColor = RGBColor(31, 119, 180);
const SIM: RGBColor = RGBColor(255, 127, 14);

/// Errors drawing or templating (rare: a bug, not bad input).
#[derive(Debug, thiserror::Error)]
pub enum HtmlError {
    /// A plot failed to draw.
    #[error("drawing the {what} plot: {msg}")]
    Plot {
        /// Which plot.
        what: String,
        /// Why.
        msg: String,
    },
    /// The template failed.
    #[error("rendering the HTML report")]
    Template(#[from] minijinja::Error),
}

fn plot_err<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> HtmlError + '_ {
    move |e| HtmlError::Plot {
        what: what.to_string(),
        msg: format!("{e:?}"),
    }
}

/// Up to `n` evenly spaced elements (keeps the first and last).
fn thin<T: Copy>(v: &[T], n: usize) -> Vec<T> {
    if v.len() <= n {
        return v.to_vec();
    }
    (0..n).map(|i| v[i * (v.len() - 1) / (n - 1)]).collect()
}

fn range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.03;
    (lo - pad, hi + pad)
}

/// A tick label as a person writes it: `2000`, `0.25`, `12.5`, never
/// `2000.0` (at most four decimals, trailing zeros dropped).
pub fn tick(v: &f64) -> String {
    let v = if v.abs() < 5e-5 { 0.0 } else { *v };
    if v.abs() >= 1000.0 {
        return format!("{v:.0}");
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One side's line, labelled `name` in the legend.
fn line(
    c: &mut Chart<'_, '_>,
    title: &str,
    pts: Vec<(f64, f64)>,
    color: RGBColor,
    name: &str,
) -> Result<(), HtmlError> {
    c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
        .map_err(plot_err(title))?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    Ok(())
}

/// The legend box at `at`.
fn legend<'b>(
    c: &mut Chart<'b, 'b>,
    title: &str,
    at: SeriesLabelPosition,
) -> Result<(), HtmlError> {
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(at)
        .draw()
        .map_err(plot_err(title))
}

/// CDFs of two sorted samples overlaid.
pub fn cdf_svg(title: &str, real: &[f64], sim: &[f64]) -> Result<String, HtmlError> {
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err(title))?;
        let (lo, hi) = range(real.iter().chain(sim).copied());
        let mut c = ChartBuilder::on(&root)
            .caption(format!("{title}: CDF"), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(44)
            .build_cartesian_2d(lo..hi, 0.0..1.0)
            .map_err(plot_err(title))?;
        c.configure_mesh()
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .x_desc("ms")
            .y_desc("fraction")
            .draw()
            .map_err(plot_err(title))?;
        for (v, color, name) in [(real, REAL, "real"), (sim, SIM, "sim")] {
            let n = v.len().max(1) as f64;
            let pts: Vec<(f64, f64)> = thin(
                &v.iter()
                    .enumerate()
                    .map(|(i, x)| (*x, (i + 1) as f64 / n))
                    .collect::<Vec<_>>(),
                600,
            );
            line(&mut c, title, pts, color, name)?;
        }
        legend(&mut c, title, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(plot_err(title))?;
    }
    Ok(s)
}

/// QQ plot with the identity line.
pub fn qq_svg(title: &str, qq: &[[f64; 2]]) -> Result<String, HtmlError> {
    let pts: Vec<(f64, f64)> = qq.iter().map(|p| (p[0], p[1])).collect();
    identity_plot(
        title,
        "QQ",
        ("real quantile, ms", "sim quantile, ms"),
        &pts,
        3,
        SIM.filled(),
    )
}

/// Per-request real vs sim scatter (up to 4000 points) with the identity
/// line.
pub fn scatter_svg(title: &str, real: &[f64], sim: &[f64]) -> Result<String, HtmlError> {
    let pairs: Vec<(f64, f64)> = real.iter().copied().zip(sim.iter().copied()).collect();
    identity_plot(
        title,
        "per request",
        ("real, ms", "sim, ms"),
        &thin(&pairs, 4000),
        2,
        REAL.mix(0.5).filled(),
    )
}

/// Points over the identity line on equal axes (real against sim).
fn identity_plot(
    title: &str,
    what: &str,
    (x_desc, y_desc): (&str, &str),
    pts: &[(f64, f64)],
    radius: u32,
    style: ShapeStyle,
) -> Result<String, HtmlError> {
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err(title))?;
        let (lo, hi) = range(pts.iter().flat_map(|p| [p.0, p.1]));
        let mut c = ChartBuilder::on(&root)
            .caption(format!("{title}: {what}"), ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(lo..hi, lo..hi)
            .map_err(plot_err(title))?;
        c.configure_mesh()
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(plot_err(title))?;
        c.draw_series(LineSeries::new(vec![(lo, lo), (hi, hi)], BLACK.mix(0.4)))
            .map_err(plot_err(title))?;
        c.draw_series(pts.iter().map(|p| Circle::new(*p, radius, style)))
            .map_err(plot_err(title))?;
        root.present().map_err(plot_err(title))?;
    }
    Ok(s)
}

/// The y-axis label of a server series.
fn series_unit(series: &str) -> &'static str {
    match series {
        "queue_depth" => "requests waiting",
        "running" => "requests running",
        "kv_usage" => "KV cache usage (fraction)",
        _ => "value",
    }
}

/// A server series of both sides over time.
pub fn series_svg(title: &str, t: &[f64], real: &[f64], sim: &[f64]) -> Result<String, HtmlError> {
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err(title))?;
        let (x0, x1) = range(t.iter().copied());
        let (y0, y1) = range(real.iter().chain(sim).copied());
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(plot_err(title))?;
        c.configure_mesh()
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .x_desc("s since run start")
            .y_desc(series_unit(title))
            .draw()
            .map_err(plot_err(title))?;
        for (v, color, name) in [(real, REAL, "real"), (sim, SIM, "sim")] {
            let pts = thin(
                &t.iter().copied().zip(v.iter().copied()).collect::<Vec<_>>(),
                2000,
            );
            line(&mut c, title, pts, color, name)?;
        }
        legend(&mut c, title, SeriesLabelPosition::MiddleRight)?;
        root.present().map_err(plot_err(title))?;
    }
    Ok(s)
}

#[derive(Serialize)]
struct MetricPlots {
    name: String,
    cdf: String,
    qq: String,
    scatter: String,
}

#[derive(Serialize)]
struct SeriesPlot {
    name: String,
    svg: String,
}

const TEMPLATE: &str = include_str!("report.html.j2");

/// The HTML report of `c`, with `markdown` shown as the summary.
///
/// # Errors
/// A plot or the template failed.
pub fn render(c: &Comparison) -> Result<String, HtmlError> {
    let mut metrics = Vec::new();
    for (name, m) in &c.report.metrics {
        let label = name.to_uppercase();
        let (r, s) = &c.samples[name];
        let (pr, ps) = &c.per_request[name];
        metrics.push(MetricPlots {
            name: label.clone(),
            cdf: cdf_svg(&label, r, s)?,
            qq: qq_svg(&label, &m.qq)?,
            scatter: scatter_svg(
                &if *name == "itl" {
                    "ITL (per-request mean)".to_string()
                } else {
                    label
                },
                pr,
                ps,
            )?,
        });
    }
    let mut series = Vec::new();
    for a in &c.aligned {
        series.push(SeriesPlot {
            name: a.series.to_string(),
            svg: series_svg(a.series, &a.t_s, &a.real, &a.sim)?,
        });
    }
    let mut env = minijinja::Environment::new();
    env.add_template("report", TEMPLATE)?;
    let t = env.get_template("report")?;
    Ok(t.render(minijinja::context! {
        report => &c.report,
        metrics => metrics,
        series => series,
        markdown => c.report.to_markdown(),
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_written_plainly() {
        let t = |v: f64| tick(&v);
        assert_eq!(
            [
                t(2000.0),
                t(0.25),
                t(12.5),
                t(0.0),
                t(-3.0),
                t(1e-6),
                t(123_456.7)
            ],
            ["2000", "0.25", "12.5", "0", "-3", "0", "123457"]
        );
    }

    #[test]
    fn series_plots_name_their_y_axis_and_use_plain_ticks() {
        let t: Vec<f64> = (0..120).map(|i| f64::from(i) * 0.5).collect();
        let real: Vec<f64> = (0..120).map(|i| f64::from(i) * 20.0).collect();
        let svg = series_svg("queue_depth", &t, &real, &real).unwrap();
        assert!(svg.contains("requests waiting"), "y-axis label");
        let ticks: Vec<&str> = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .map(str::trim)
            .filter(|t| t.parse::<f64>().is_ok())
            .collect();
        assert!(ticks.len() >= 8, "{ticks:?}");
        assert!(ticks.contains(&"2000"), "{ticks:?}");
        assert!(!svg.contains(".0<"), "no '2000.0' tick: {svg}");
    }
}
