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
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out
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
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b':')) {
        i += 1;
    }
    if i == 0 {
        return Err(format!("expected a metric name in {line:?}"));
    }
    let name = line[..i].to_string();
    let mut p = Parser { s: b, i };
    let labels = if p.peek() == Some(b'{') {
        p.i += 1;
        p.labels_until(Some(b'}'))?
    } else {
        Vec::new()
    };
    let rest = line[p.i..].trim();
    let mut parts = rest.split_whitespace();
    let v = parts
        .next()
        .ok_or_else(|| format!("missing value for {name}"))?;
    let value =
        parse_prometheus_value(v).ok_or_else(|| format!("invalid value {v:?} for {name}"))?;
    let timestamp_ms = match parts.next() {
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| format!("invalid timestamp {t:?} for {name}"))?,
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
            let key = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
            self.skip_ws();
            if self.peek() != Some(b'=') {
                return Err(format!("expected '=' after label {key}"));
            }
            self.i += 1;
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(format!("expected a quoted value for label {key}"));
            }
            self.i += 1;
            let mut val = Vec::new();
            loop {
                match self.peek() {
                    None => return Err(format!("unterminated value of label {key}")),
                    Some(b'"') => {
                        self.i += 1;
                        break;
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
            labels.push((key, String::from_utf8_lossy(&val).into_owned()));
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
}
