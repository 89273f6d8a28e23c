//! A small parser of the Prometheus text exposition format (version 0.0.4),
//! for scraping vLLM and SGLang `/metrics`.
//!
//! Written here because `prometheus-parse` drops every metric whose name
//! contains `:` (all of vLLM's `vllm:` and SGLang's `sglang:` metrics).
//!
//! ```
//! let text = "# TYPE vllm:num_requests_running gauge\n\
//!             vllm:num_requests_running{model_name=\"m\"} 3.0\n";
//! let samples = blis_traces::prom::parse(text).unwrap();
//! assert_eq!(samples[0].name, "vllm:num_requests_running");
//! assert_eq!(samples[0].label("model_name"), Some("m"));
//! assert_eq!(samples[0].value, 3.0);
//! ```

use crate::companions::parse_prometheus_value;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with `_total`, `_bucket`, `_sum`, `_count` suffixes as
    /// exposed).
    pub name: String,
    /// Labels in the order written.
    pub labels: Vec<(String, String)>,
    /// Value (NaN and ±Inf allowed).
    pub value: f64,
    /// Optional timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The labels in text form without braces (`k="v",k2="v2"`), escaped.
    pub fn labels_text(&self) -> String {
        render_labels(&self.labels)
    }
}

/// Renders labels as `k="v",...` with Prometheus escaping.
pub fn render_labels(labels: &[(String, String)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if !k.is_empty() && k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
            out.push_str(k);
        } else {
            // A Prometheus 3 name outside the classic characters, quoted
            // as it was read.
            push_quoted(&mut out, k);
        }
        out.push('=');
        push_quoted(&mut out, v);
    }
    out
}

/// `"s"`, escaped.
fn push_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses labels in text form (`k="v",k2="v2"`, as [`render_labels`] writes).
///
/// # Errors
/// Malformed label text.
pub fn parse_labels(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let labels = p.labels_until(None)?;
    if p.i != p.s.len() {
        return Err(format!(
            "unexpected text after labels at column {}",
            p.i + 1
        ));
    }
    Ok(labels)
}

/// Parses a whole exposition; comments and blank lines are skipped.
///
/// # Errors
/// The first malformed line, as `line N: what`.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(sample) = sample_line(line).map_err(|e| format!("line {}: {e}", i + 1))? {
            out.push(sample);
        }
    }
    Ok(out)
}

/// An exposition read line by line ([`parse_lenient`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    /// The samples of the lines read, in order.
    pub samples: Vec<Sample>,
    /// Lines that could not be read as a sample and were skipped.
    pub skipped: usize,
    /// The first of them, as `line N: what`.
    pub first_skipped: Option<String>,
}

/// Parses a whole exposition as a scraper wants it: a line that cannot be
/// read is skipped and counted, the others kept. Prometheus itself fails
/// the whole scrape on one bad line; a benchmark would then lose every
/// `vllm:` metric of its run to one line of someone else's metric (a
/// gateway's, an exporter's), so it keeps what it can read and says what
/// it skipped.
pub fn parse_lenient(text: &str) -> Exposition {
    let mut out = Exposition::default();
    for (i, line) in text.lines().enumerate() {
        match sample_line(line) {
            Ok(Some(sample)) => out.samples.push(sample),
            Ok(None) => {}
            Err(e) => {
                out.skipped += 1;
                if out.first_skipped.is_none() {
                    out.first_skipped = Some(format!("line {}: {e}", i + 1));
                }
            }
        }
    }
    out
}

/// One line: `None` for a comment or a blank line.
fn sample_line(line: &str) -> Result<Option<Sample>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    parse_line(line).map(Some)
}

/// A sample line: `name{labels} value [timestamp]`, as the text format
/// 0.0.4 writes it; also as OpenMetrics 1.0 writes it (a timestamp in
/// seconds with a fraction, an exemplar `# {labels} value [timestamp]`
/// after the sample, ignored) and as Prometheus 3 writes a name outside
/// the classic characters (`{"name.with.dots",label="v"}`, label names
/// quoted the same way).
fn parse_line(line: &str) -> Result<Sample, String> {
    let b = line.as_bytes();
    let mut p = Parser { s: b, i: 0 };
    let (name, labels) = if p.peek() == Some(b'{') {
        // Prometheus 3: the quoted name first inside the braces.
        p.i += 1;
        p.skip_ws();
        if p.peek() != Some(b'"') {
            return Err(format!("expected a metric name in {line:?}"));
        }
        let name = p.quoted(None)?;
        p.skip_ws();
        let labels = match p.peek() {
            Some(b',') => {
                p.i += 1;
                p.labels_until(Some(b'}'))?
            }
            Some(b'}') => {
                p.i += 1;
                Vec::new()
            }
            _ => return Err(format!("expected ',' or '}}' after the name {name:?}")),
        };
        (name, labels)
    } else {
        while p
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b':'))
        {
            p.i += 1;
        }
        if p.i == 0 {
            return Err(format!("expected a metric name in {line:?}"));
        }
        let name = line[..p.i].to_string();
        let labels = if p.peek() == Some(b'{') {
            p.i += 1;
            p.labels_until(Some(b'}'))?
        } else {
            Vec::new()
        };
        (name, labels)
    };
    let rest = line[p.i..].trim();
    let mut parts = rest.split_whitespace();
    let v = parts
        .next()
        .ok_or_else(|| format!("missing value for {name}"))?;
    let value =
        parse_prometheus_value(v).ok_or_else(|| format!("invalid value {v:?} for {name}"))?;
    let timestamp_ms = match parts.next() {
        // An exemplar (OpenMetrics) after the value.
        Some(t) if t.starts_with('#') => None,
        Some(t) => Some(
            t.parse::<i64>()
                .ok()
                .or_else(|| openmetrics_seconds_ms(t))
                .ok_or_else(|| format!("invalid timestamp {t:?} for {name}"))?,
        ),
        None => None,
    };
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// An OpenMetrics timestamp (seconds since the epoch, with a fraction) in
/// ms; `None` when it is not a finite number of seconds within ±2^53 ms.
fn openmetrics_seconds_ms(t: &str) -> Option<i64> {
    let ms = (t.parse::<f64>().ok()? * 1e3).round();
    (ms.is_finite() && ms.abs() <= 2f64.powi(53)).then_some(ms as i64)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c == b' ' || c == b'\t') {
            self.i += 1;
        }
    }

    /// A quoted string at the parser (on its opening quote), unescaped
    /// (`\\`, `\"`, `\n`): the value of label `label`, or a quoted name.
    fn quoted(&mut self, label: Option<&str>) -> Result<String, String> {
        self.i += 1;
        let mut val = Vec::new();
        loop {
            match self.peek() {
                None => {
                    return Err(match label {
                        Some(key) => format!("unterminated value of label {key}"),
                        None => "unterminated quoted name".into(),
                    });
                }
                Some(b'"') => {
                    self.i += 1;
                    return Ok(String::from_utf8_lossy(&val).into_owned());
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(b'n') => val.push(b'\n'),
                        Some(c) => val.push(c),
                        None => return Err("dangling escape".into()),
                    }
                    self.i += 1;
                }
                Some(c) => {
                    val.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// Labels up to `close` (consumed) or the end of input.
    fn labels_until(&mut self, close: Option<u8>) -> Result<Vec<(String, String)>, String> {
        let mut labels = Vec::new();
        loop {
            self.skip_ws();
            match (self.peek(), close) {
                (Some(c), Some(cl)) if c == cl => {
                    self.i += 1;
                    return Ok(labels);
                }
                (None, None) => return Ok(labels),
                (None, Some(_)) => return Err("unterminated label set".into()),
                _ => {}
            }
            let key = if self.peek() == Some(b'"') {
                // Prometheus 3: a label name outside the classic characters.
                self.quoted(None)?
            } else {
                let start = self.i;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
                {
                    self.i += 1;
                }
                if self.i == start {
                    return Err(format!("expected a label name at column {}", self.i + 1));
                }
                String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
            };
            self.skip_ws();
            if self.peek() != Some(b'=') {
                return Err(format!("expected '=' after label {key}"));
            }
            self.i += 1;
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(format!("expected a quoted value for label {key}"));
            }
            let value = self.quoted(Some(&key))?;
            labels.push((key, value));
            self.skip_ws();
            if self.peek() == Some(b',') {
                self.i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An excerpt of a real vLLM V1 `/metrics` body.
    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0431
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.9873e+00
python_gc_objects_collected_total{generation="0"} 9301.0
process_start_time_seconds 1.7e9 1700000000000
"#;

    #[test]
    fn parses_vllm_names_labels_and_special_values() {
        let s = parse(VLLM).unwrap();
        assert_eq!(s.len(), 9);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].value, 12.0);
        assert_eq!(s[0].label("engine"), Some("0"));
        assert_eq!(s[4].label("le"), Some("+Inf"));
        assert_eq!(s[6].value, 1.9873);
        assert_eq!(s[8].timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(
            s[0].labels_text(),
            "engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\""
        );
    }

    #[test]
    fn escapes_round_trip_and_errors_name_the_line() {
        let labels = vec![("a".to_string(), "x\"y\\z\nw".to_string())];
        let text = render_labels(&labels);
        assert_eq!(parse_labels(&text).unwrap(), labels);
        let err = parse("ok 1\nbad{x=1} 2\n").unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(parse("m{a=\"b\"} notanumber").is_err());
    }

    #[test]
    fn openmetrics_timestamps_and_exemplars_are_read() {
        let text = "# TYPE vllm:e2e_request_latency_seconds histogram\n\
            vllm:e2e_request_latency_seconds_bucket{le=\"0.3\"} 17 # {trace_id=\"KOO5S4vxi0o\"} 0.67\n\
            vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\"} 20 1520879607.789 # {trace_id=\"oHg5SJYRHA0\"} 9.8 1520879602.029\n\
            vllm:num_requests_running 3 1520879607.789\n\
            # EOF\n";
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].value, s[0].timestamp_ms), (17.0, None));
        assert_eq!(s[1].label("le"), Some("+Inf"));
        assert_eq!(
            (s[1].value, s[1].timestamp_ms),
            (20.0, Some(1_520_879_607_789))
        );
        assert_eq!(s[2].timestamp_ms, Some(1_520_879_607_789));
        assert!(parse("m 1 1e300").is_err());
    }

    #[test]
    fn prometheus_3_quoted_names_are_read_and_written_back_quoted() {
        let text = "{\"http.server.duration\",\"service.name\"=\"gw\",code=\"200\"} 0.25\n\
            {\"vllm:odd.name\"} 2\n";
        let s = parse(text).unwrap();
        assert_eq!(s[0].name, "http.server.duration");
        assert_eq!(s[0].label("service.name"), Some("gw"));
        assert_eq!(s[0].label("code"), Some("200"));
        assert_eq!(s[1].name, "vllm:odd.name");
        assert!(s[1].labels.is_empty());
        let text = s[0].labels_text();
        assert_eq!(text, "\"service.name\"=\"gw\",code=\"200\"");
        assert_eq!(parse_labels(&text).unwrap(), s[0].labels);
        assert!(parse("{\"unterminated} 1").is_err());
        assert!(parse("{name} 1").is_err());
    }

    #[test]
    fn a_lenient_parse_keeps_every_line_it_can_read_and_names_the_first_it_cannot() {
        let text = format!("{VLLM}gateway_requests{{route=/v1}} 5\nthis is not a metric\n");
        assert!(parse(&text).unwrap_err().starts_with("line 16:"));
        let e = parse_lenient(&text);
        assert_eq!(e.samples, parse(VLLM).unwrap());
        assert_eq!(e.skipped, 2);
        let first = e.first_skipped.unwrap();
        assert!(
            first.starts_with("line 16: expected a quoted value for label route"),
            "{first}"
        );
        assert_eq!(parse_lenient(VLLM).skipped, 0);
    }
}
