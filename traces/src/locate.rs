//! Finds the line of a field path (`clients[1].arrival.cv`) in block-style
//! YAML text, so that errors found after parsing still name file:line.
//!
//! This is deliberately small: it understands indentation, `key:` entries
//! and `- ` sequence items, which is what workload specs are written in.
//! When a path cannot be followed to its end (flow style, anchors), the
//! deepest part found is returned.

#[derive(Debug, Clone)]
enum Entry {
    Dash {
        col: usize,
        line: usize,
    },
    Key {
        col: usize,
        line: usize,
        name: String,
    },
}

impl Entry {
    fn col(&self) -> usize {
        match self {
            Entry::Dash { col, .. } | Entry::Key { col, .. } => *col,
        }
    }
    fn line(&self) -> usize {
        match self {
            Entry::Dash { line, .. } | Entry::Key { line, .. } => *line,
        }
    }
}

fn entries(text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with("---") {
            continue;
        }
        let mut col = raw.len() - trimmed.len();
        let mut rest = trimmed;
        while rest == "-" || rest.starts_with("- ") {
            out.push(Entry::Dash { col, line });
            let after = rest[1..].trim_start();
            col += rest.len() - after.len();
            rest = after;
        }
        if let Some((key, _)) = rest.split_once(':') {
            let name = key.trim().trim_matches('"').trim_matches('\'');
            if !name.is_empty() && !name.contains(' ') && !name.starts_with('{') {
                out.push(Entry::Key {
                    col,
                    line,
                    name: name.to_string(),
                });
            }
        }
    }
    out
}

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// Splits `clients[1].arrival.cv` into segments.
pub(crate) fn parse_path(path: &str) -> Vec<Seg> {
    let mut segs = Vec::new();
    for part in path.split('.') {
        let mut p = part;
        if let Some(open) = p.find('[') {
            if open > 0 {
                segs.push(Seg::Key(p[..open].to_string()));
            }
            p = &p[open..];
            while let Some(rest) = p.strip_prefix('[') {
                let Some(close) = rest.find(']') else { break };
                if let Ok(i) = rest[..close].parse() {
                    segs.push(Seg::Index(i));
                }
                p = &rest[close + 1..];
            }
        } else if !p.is_empty() {
            segs.push(Seg::Key(p.to_string()));
        }
    }
    segs
}

/// The 1-based (line, column) where `path` is written in `text`, or of its
/// deepest ancestor that could be found.
pub(crate) fn locate(text: &str, path: &str) -> Option<(u64, u64)> {
    let es = entries(text);
    let segs = parse_path(path);
    // Scope: entries in es[start..] with col > parent_col (until one is not).
    let mut start = 0usize;
    let mut parent_col: isize = -1;
    let mut found: Option<&Entry> = None;
    for seg in &segs {
        let scope: Vec<(usize, &Entry)> = es[start..]
            .iter()
            .enumerate()
            .map(|(i, e)| (start + i, e))
            .take_while(|(_, e)| e.col() as isize > parent_col)
            .collect();
        let hit = match seg {
            Seg::Key(k) => {
                let min_col = scope
                    .iter()
                    .filter(|(_, e)| matches!(e, Entry::Key { .. }))
                    .map(|(_, e)| e.col())
                    .min();
                scope.iter().find(|(_, e)| {
                    matches!(e, Entry::Key { name, col, .. } if name == k && Some(*col) == min_col)
                })
            }
            Seg::Index(n) => {
                let min_col = scope
                    .iter()
                    .filter(|(_, e)| matches!(e, Entry::Dash { .. }))
                    .map(|(_, e)| e.col())
                    .min();
                scope
                    .iter()
                    .filter(|(_, e)| matches!(e, Entry::Dash { col, .. } if Some(*col) == min_col))
                    .nth(*n)
            }
        };
        match hit {
            Some((idx, e)) => {
                found = Some(e);
                start = idx + 1;
                parent_col = e.col() as isize;
            }
            None => break,
        }
    }
    found.map(|e| (e.line() as u64, e.col() as u64 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "version: \"1\"\nseed: 42\nclients:\n  - id: a\n    rate_fraction: 0.5\n    arrival:\n      process: gamma\n  - id: b\n    arrival: {process: poisson}\n    input_distribution:\n      type: gaussian\n      params:\n        mean: 5\n";

    #[test]
    fn finds_nested_keys_and_items() {
        assert_eq!(locate(SPEC, "seed"), Some((2, 1)));
        assert_eq!(locate(SPEC, "clients[0].rate_fraction"), Some((5, 5)));
        assert_eq!(locate(SPEC, "clients[0].arrival.process"), Some((7, 7)));
        assert_eq!(locate(SPEC, "clients[1]"), Some((8, 3)));
        assert_eq!(
            locate(SPEC, "clients[1].input_distribution.params.mean"),
            Some((13, 9))
        );
    }

    #[test]
    fn falls_back_to_deepest_ancestor() {
        // Flow-style mapping: the key is not on its own line.
        assert_eq!(locate(SPEC, "clients[1].arrival.process"), Some((9, 5)));
        assert_eq!(locate(SPEC, "nope"), None);
    }
}
