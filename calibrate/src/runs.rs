//! A folder of runs: each sub-folder a real vLLM run laid out like
//! `vllm-ground-truth/train` (read by the `vllm-gt` importer), each
//! `*.yaml` file beside them a trace header (e.g. written by
//! `blis-loadgen`). `fit --runs` and `benchmark` read them.

use std::path::{Path, PathBuf};

use blis_traces::{ImportKind, ImportSource, Trace, import};

/// One run of a folder and its trace.
#[derive(Debug, Clone)]
pub struct RunDir {
    /// The folder or file name (without `.yaml`).
    pub name: String,
    /// Its path.
    pub path: PathBuf,
    /// The served model id (the trace header's, else empty).
    pub model: String,
    /// The trace.
    pub trace: Trace,
}

/// The runs of `dir`, sorted by name. Entries that are not readable runs
/// are listed in `skipped` with the reason; other files are ignored.
///
/// # Errors
/// `dir` cannot be listed.
pub fn runs_in(dir: &Path, skipped: &mut Vec<(String, String)>) -> std::io::Result<Vec<RunDir>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let name = if path.is_dir() {
            path.file_name()
        } else {
            path.file_stem()
        }
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
        let trace = if path.is_dir() {
            let src = ImportSource {
                kind: ImportKind::VllmGt,
                path: path.clone(),
            };
            import(&src, 42).map_err(|e| e.to_string())
        } else {
            Trace::read(&path).map_err(|e| e.to_string())
        };
        match trace {
            Ok(trace) => {
                let model = trace
                    .header
                    .server
                    .as_ref()
                    .and_then(|s| s.model.clone())
                    .unwrap_or_default();
                out.push(RunDir {
                    name,
                    path,
                    model,
                    trace,
                });
            }
            Err(e) => skipped.push((name, format!("not a readable run: {e}"))),
        }
    }
    Ok(out)
}

/// The workload of a run named like `DATE-TIME-MODEL-tpN-WORKLOAD`.
pub fn workload_of(name: &str) -> String {
    match name.rfind("-tp") {
        Some(i) => name[i + 3..]
            .split_once('-')
            .map_or(name.to_string(), |(_, w)| w.to_string()),
        None => name.rsplit('-').next().unwrap_or(name).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_come_from_folder_names() {
        assert_eq!(
            workload_of("20260217-155451-llama-2-7b-tp1-codegen"),
            "codegen"
        );
        assert_eq!(
            workload_of("20260218-150304-codellama-34b-tp2-general"),
            "general"
        );
        assert_eq!(workload_of("run-x-chat"), "chat");
    }
}
