//! Errors people can act on (issue 17 item 7): every bad input of the
//! table in `docs/errors.md` is run through the real binary, and its exit
//! code and the first line of what it prints must be the table's, word for
//! word. A failure that is not a usage error prints exactly one line. After
//! a deliberate change, `BLIS_UPDATE_DOCS=1 cargo test -p blis-tests --test
//! errors` rewrites the table.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const HEADER: &[u8] = b"trace_version: 3\nmode: generated\ndata_file: t.csv\n";
const CSV: &[u8] =
    b"request_id,input_tokens,output_tokens,arrival_time_us\n0,10,5,0\n1,20,5,1000\n";
const SPEC: &str = "aggregate_rate: 10\nnum_requests: 5\nclients:\n  - id: a\n    arrival: {process: poisson}\n    input_distribution: {type: constant, params: {value: 100}}\n    output_distribution: {type: constant, params: {value: 10}}\n";

/// One bad input: what it is, the binary and its arguments (`{d}`: the
/// case's folder; `{refused}`, `{notapi}`, `{auth}`, `{silent}`: servers), and the
/// files it needs.
struct Case {
    what: &'static str,
    bin: &'static str,
    args: &'static [&'static str],
    files: Vec<(&'static str, Vec<u8>)>,
}

fn case(
    what: &'static str,
    bin: &'static str,
    args: &'static [&'static str],
    files: &[(&'static str, &[u8])],
) -> Case {
    Case {
        what,
        bin,
        args,
        files: files.iter().map(|(n, b)| (*n, b.to_vec())).collect(),
    }
}

fn spec_with(from: &str, to: &str) -> Vec<u8> {
    assert!(SPEC.contains(from), "{from}");
    SPEC.replace(from, to).into_bytes()
}

fn csv_with(row: &str) -> Vec<u8> {
    format!("request_id,input_tokens,output_tokens,arrival_time_us,deadline_us,reason_ratio,status\n0,10,5,0,,,\n{row}\n")
        .into_bytes()
}

const TRACE: &[&str] = &[
    "run",
    "--model",
    MODEL,
    "--trace",
    "{d}/t.yaml",
    "--out",
    "{d}/o",
];
const SPEC_RUN: &[&str] = &[
    "run",
    "--model",
    MODEL,
    "--workload-spec",
    "{d}/w.yaml",
    "--out",
    "{d}/o",
];
const GEN: &[&str] = &[
    "generate",
    "--workload-spec",
    "{d}/w.yaml",
    "--out",
    "{d}/o",
];

fn cases() -> Vec<Case> {
    let h = HEADER;
    let t = |csv: Vec<u8>| vec![("t.yaml", h.to_vec()), ("t.csv", csv)];
    let spec = |w: Vec<u8>| vec![("w.yaml", w)];
    let mut v = vec![
        // Traces.
        case("trace header missing", "blis-replay", TRACE, &[]),
        case("trace header not YAML", "blis-replay", TRACE, &[("t.yaml", b"trace_version: [3\n"), ("t.csv", CSV)]),
        case("trace header of an unknown version", "blis-replay", TRACE, &[("t.yaml", b"trace_version: 9\ndata_file: t.csv\n"), ("t.csv", CSV)]),
        case("trace times not in microseconds", "blis-replay", TRACE, &[("t.yaml", b"trace_version: 3\ntime_unit: seconds\ndata_file: t.csv\n"), ("t.csv", CSV)]),
        case("request CSV missing", "blis-replay", TRACE, &[("t.yaml", HEADER)]),
        case("request CSV empty", "blis-replay", TRACE, &[("t.yaml", HEADER), ("t.csv", b"")]),
        case("request CSV truncated mid-row (a finished trace)", "blis-replay", TRACE, &[("t.yaml", HEADER), ("t.csv", b"request_id,input_tokens,output_tokens,arrival_time_us\n0,10,5,0\n1,20")]),
        case("request CSV row with an extra column", "blis-replay", TRACE, &[("t.yaml", HEADER), ("t.csv", b"request_id,input_tokens,output_tokens,arrival_time_us\n0,10,5,0,7\n")]),
        case("request CSV with another version's header (no arrival_time_us)", "blis-replay", TRACE, &[("t.yaml", HEADER), ("t.csv", b"request_id,input_tokens,output_tokens,timestamp\n0,10,5,0\n")]),
        case("request CSV not UTF-8", "blis-replay", TRACE, &[("t.yaml", HEADER), ("t.csv", b"request_id,input_tokens,output_tokens,arrival_time_us,client_id\n0,10,5,0,\xff\xfe\n")]),
    ];
    let rows: [(&'static str, &str); 7] = [
        ("input_tokens not a number", "1,ten,5,1000,,,"),
        ("negative output_tokens", "1,10,-5,1000,,,"),
        (
            "output_tokens past the integer limit",
            "1,10,4294967296,1000,,,",
        ),
        ("NaN reason_ratio", "1,10,5,1000,,NaN,"),
        ("reason_ratio above 1", "1,10,5,1000,,1.5,"),
        ("an unknown status", "1,10,5,1000,,,maybe"),
        (
            "an arrival 292 million years away",
            "1,10,5,9223372036854775000,,,",
        ),
    ];
    for (what, row) in rows {
        v.push(Case {
            what,
            bin: "blis-replay",
            args: TRACE,
            files: t(csv_with(row)),
        });
    }
    v.extend([
        case(
            "ITL companion with a bad timestamp",
            "blis-replay",
            TRACE,
            &[
                (
                    "t.yaml",
                    b"trace_version: 3\ndata_file: t.csv\nitl_file: t.itl.csv\n",
                ),
                ("t.csv", CSV),
                (
                    "t.itl.csv",
                    b"request_id,chunk_index,timestamp_us\n0,0,soon\n",
                ),
            ],
        ),
        case(
            "metrics companion with a bad value",
            "blis-replay",
            TRACE,
            &[
                (
                    "t.yaml",
                    b"trace_version: 3\ndata_file: t.csv\nmetrics_file: t.m.csv\n",
                ),
                ("t.csv", CSV),
                (
                    "t.m.csv",
                    b"timestamp_us,name,labels,value\n0,vllm:x,,lots\n",
                ),
            ],
        ),
        case(
            "header naming a file outside its folder",
            "blis-replay",
            TRACE,
            &[("t.yaml", b"trace_version: 3\ndata_file: ../../etc/passwd\n")],
        ),
    ]);
    // Workload specs.
    v.extend([
        Case { what: "spec file missing", bin: "blis-replay", args: SPEC_RUN, files: vec![] },
        Case { what: "spec not YAML", bin: "blis-replay", args: SPEC_RUN, files: spec(b"clients: [\n".to_vec()) },
        Case { what: "spec with an unknown field", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("num_requests: 5", "num_request: 5")) },
        Case { what: "spec rate NaN", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("aggregate_rate: 10", "aggregate_rate: .nan")) },
        Case { what: "spec rate negative", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("aggregate_rate: 10", "aggregate_rate: -10")) },
        Case { what: "spec of an unknown version", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("aggregate_rate: 10", "version: \"7\"\naggregate_rate: 10")) },
        Case { what: "unknown arrival process", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("process: poisson", "process: fractal")) },
        Case { what: "unknown distribution type", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("{type: constant, params: {value: 10}}", "{type: zipf, params: {value: 10}}")) },
        Case { what: "unknown SLO class", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("  - id: a\n", "  - id: a\n    slo_class: urgent\n")) },
        Case { what: "distribution parameter overflowing (1e300 tokens)", bin: "blis-loadgen", args: GEN, files: spec(spec_with("{type: constant, params: {value: 10}}", "{type: exponential, params: {mean: 1e300}}")) },
        Case { what: "distribution missing a parameter", bin: "blis-loadgen", args: GEN, files: spec(spec_with("{type: constant, params: {value: 10}}", "{type: gaussian, params: {mean: 10}}")) },
        Case { what: "a client that never stops", bin: "blis-loadgen", args: GEN, files: spec(spec_with("num_requests: 5\n", "")) },
        Case { what: "a rate that plans 3.6·10^15 requests", bin: "blis-loadgen", args: GEN, files: spec(spec_with("aggregate_rate: 10\nnum_requests: 5", "aggregate_rate: 1e12\nhorizon_us: 3600000000")) },
        Case { what: "a rate so low that no request arrives within 285 years", bin: "blis-replay", args: SPEC_RUN, files: spec(spec_with("aggregate_rate: 10\n", "aggregate_rate: 1e-300\n")) },
        Case { what: "duplicate client ids", bin: "blis-loadgen", args: GEN, files: spec(format!("{SPEC}  - id: a\n    arrival: {{process: poisson}}\n    input_distribution: {{type: constant, params: {{value: 1}}}}\n    output_distribution: {{type: constant, params: {{value: 1}}}}\n").into_bytes()) },
    ]);
    // Importers and flags.
    v.extend([
        case("Mooncake line that is not JSON", "blis-loadgen", &["generate", "--import", "mooncake:{d}/m.jsonl", "--out", "{d}/o"], &[("m.jsonl", b"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 5}\n{\"timestamp\": 1, oops}\n")]),
        case("Azure row with a bad datetime", "blis-loadgen", &["generate", "--import", "azure:{d}/a.csv", "--out", "{d}/o"], &[("a.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n")]),
        case("an unknown import kind", "blis-loadgen", &["generate", "--import", "sharegpt:{d}/x.json", "--out", "{d}/o"], &[]),
        case("a ground-truth folder that is not one", "blis-replay", &["run", "--import", "vllm-gt:{d}", "--out", "{d}/o"], &[]),
        case("a model with no config and no coefficients", "blis-replay", &["run", "--model", "acme/unknown-7b", "--latency-model", "roofline", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("max_num_seqs 0", "blis-replay", &["run", "--model", MODEL, "--max-num-seqs", "0", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a block size past any attention backend's", "blis-replay", &["run", "--model", MODEL, "--block-size", "1000000", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a block size of 0", "blis-replay", &["run", "--model", MODEL, "--block-size", "0", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a GPU memory fraction above 1", "blis-replay", &["run", "--model", MODEL, "--gpu-memory-utilization", "2", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a GPU memory fraction too small for the weights", "blis-replay", &["run", "--model", "qwen/qwen2.5-7b-instruct", "--hardware", "H100", "--gpu-memory-utilization", "0.1", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a horizon that is not a number", "blis-replay", &["run", "--model", MODEL, "--horizon-s", "nan", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a cluster of 10^8 instances", "blis-replay", &["run", "--model", MODEL, "--num-instances", "100000000", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a TP degree the model's heads do not divide by", "blis-replay", &["run", "--model", MODEL, "--tp", "3", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("an unknown routing policy (usage)", "blis-replay", &["run", "--model", MODEL, "--routing", "fastest", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a policy bundle with a negative weight", "blis-replay", &["run", "--model", MODEL, "--policy-config", "{d}/p.yaml", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes()), ("p.yaml", b"routing: {policy: weighted, scorers: {queue-depth: -1}}\n")]),
        case("a drain policy a P/D split cannot use", "blis-replay", &["run", "--model", MODEL, "--architecture", "pd", "--autoscaler", "threshold", "--drain-policy", "immediate", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("an admission tree with another policy's leaf", "blis-replay", &["run", "--model", MODEL, "--policy-config", "{d}/p.yaml", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes()), ("p.yaml", b"admission: {policy: decision-tree, tree: {when: {signal: waiting, above: 9}, then: {admit: false}, else: {score: {constant: 1}}}}\n")]),
        case("a priority program that answers NaN", "blis-replay", &["run", "--model", MODEL, "--policy-config", "{d}/p.yaml", "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes()), ("p.yaml", b"num_instances: 2\npriority: {policy: code, source: 'fn priority(r) { 0.0 / 0.0 }'}\n")]),
        case("output folder that cannot be created", "blis-replay", &["run", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--out", "/proc/blis/o"], &[("w.yaml", SPEC.as_bytes())]),
        // Servers.
        case("an unreachable server", "blis-loadgen", &["run", "--server-url", "{refused}", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a server that takes the connection and never answers", "blis-loadgen", &["run", "--server-url", "{silent}", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--timeout-s", "1", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a server that is not OpenAI-compatible", "blis-loadgen", &["run", "--server-url", "{notapi}", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a server that wants an API key (401)", "blis-loadgen", &["run", "--server-url", "{auth}", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("an https server, with a build that has no TLS", "blis-loadgen", &["run", "--server-url", "https://127.0.0.1:9", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("a negative rate (usage)", "blis-loadgen", &["run", "--server-url", "{refused}", "--model", MODEL, "--rate", "-5", "--num-requests", "3", "--out", "{d}/o"], &[]),
        case("more client threads than the OS gives (usage)", "blis-loadgen", &["run", "--server-url", "{refused}", "--model", MODEL, "--rate", "1", "--num-requests", "3", "--client-threads", "100000", "--out", "{d}/o"], &[]),
        case("a wait for the server that is not a number (usage)", "blis-loop", &["--wait-for-server-s", "nan", "--out", "{d}/o"], &[]),
        case("a server URL with a query string (usage)", "blis-loadgen", &["run", "--server-url", "http://127.0.0.1:9/v1?api-version=2024-02-01", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--out", "{d}/o"], &[("w.yaml", SPEC.as_bytes())]),
        case("an output prefix that is a folder (usage)", "blis-replay", &["run", "--model", MODEL, "--workload-spec", "{d}/w.yaml", "--out", "{d}/"], &[("w.yaml", SPEC.as_bytes())]),
        // Calibration.
        case("comparing traces of different requests", "blis-calibrate", &["compare", "--real", "{d}/t.yaml", "--sim", "{d}/u.yaml", "--out", "{d}/r"], &[("t.yaml", HEADER), ("t.csv", CSV), ("u.yaml", b"trace_version: 3\ndata_file: u.csv\n"), ("u.csv", b"request_id,input_tokens,output_tokens,arrival_time_us\n7,10,5,0\n")]),
        case("fitting on a folder with no runs", "blis-calibrate", &["fit", "--runs", "{d}", "--out", "{d}/f"], &[]),
        case("more bootstrap resamples than fit in memory (usage)", "blis-calibrate", &["compare", "--real", "{d}/t.yaml", "--sim", "{d}/t.yaml", "--resamples", "100000000000", "--out", "{d}/r"], &[("t.yaml", HEADER), ("t.csv", CSV)]),
    ]);
    v
}

/// A server on loopback that answers every request with `response`; its URL.
fn server(response: &'static str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 65536];
            let _ = s.read(&mut buf);
            let _ = s.write_all(response.as_bytes());
        }
    });
    url
}

/// A server that accepts connections and never answers them.
fn silent_server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for c in l.incoming() {
            let Ok(c) = c else { return };
            open.push(c);
        }
    });
    url
}

fn refused_url() -> String {
    // A port nothing listens on: bound, then closed.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

fn bin(name: &str) -> PathBuf {
    // The test binary is target/PROFILE/deps/errors-HASH.
    let mut p = std::env::current_exe().unwrap();
    p.pop();
    p.pop();
    p.join(name)
}

/// A table cell: `|` escaped, one line.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

#[test]
fn every_bad_input_of_the_table_gives_its_message_and_exit_code() {
    for b in ["blis-replay", "blis-loadgen", "blis-calibrate"] {
        assert!(
            bin(b).exists(),
            "{} is built (cargo build builds it)",
            bin(b).display()
        );
    }
    let notapi = server(
        "HTTP/1.1 404 Not Found\r\ncontent-type: text/html\r\ncontent-length: 22\r\nconnection: close\r\n\r\n<html>not found</html>",
    );
    let auth = server(
        "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: 27\r\nconnection: close\r\n\r\n{\"error\":\"Unauthorized\"}\n\n",
    );
    let refused = refused_url();
    let silent = silent_server();
    let root = tempfile::tempdir().unwrap();
    let mut table = String::from(
        "| # | bad input | command | what it prints (first line) | exit |\n|---:|---|---|---|---:|\n",
    );
    for (i, c) in cases().iter().enumerate() {
        let d = root.path().join(format!("c{i}"));
        std::fs::create_dir_all(&d).unwrap();
        for (name, bytes) in &c.files {
            std::fs::write(d.join(name), bytes).unwrap();
        }
        let subst = |a: &str| {
            a.replace("{d}", d.to_str().unwrap())
                .replace("{refused}", &refused)
                .replace("{notapi}", &notapi)
                .replace("{auth}", &auth)
                .replace("{silent}", &silent)
        };
        let args: Vec<String> = c.args.iter().map(|a| subst(a)).collect();
        let out = Command::new(bin(c.bin))
            .args(&args)
            .env_remove("BLIS_SERVER_URL")
            .env_remove("BLIS_API_KEY")
            .output()
            .unwrap();
        let code = out.status.code().unwrap_or(-1);
        let unplace = |s: &str| {
            s.replace(d.to_str().unwrap(), "DIR")
                .replace(&refused, "http://127.0.0.1:PORT")
                .replace(&notapi, "http://127.0.0.1:PORT")
                .replace(&auth, "http://127.0.0.1:PORT")
                .replace(&silent, "http://127.0.0.1:PORT")
        };
        let stderr = unplace(&String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("warning:"))
            .collect();
        assert!(code != 0, "{}: exit code 0\n{stderr}", c.what);
        assert!(!stderr.contains("panicked"), "{}: {stderr}", c.what);
        let first = lines.first().copied().unwrap_or("");
        assert!(first.starts_with("error:"), "{}: {stderr}", c.what);
        if code != 2 {
            assert_eq!(lines.len(), 1, "{}: one line\n{stderr}", c.what);
        }
        let shown: Vec<String> = args.iter().map(|a| unplace(a)).collect();
        table.push_str(&format!(
            "| {} | {} | `{} {}` | `{}` | {code} |\n",
            i + 1,
            cell(c.what),
            c.bin,
            cell(&shown.join(" ")),
            cell(first)
        ));
    }
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/errors.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_default();
    let begin = "<!-- table: generated by tests/tests/errors.rs -->\n";
    let end = "<!-- end of table -->";
    let (pre, rest) = doc.split_once(begin).unwrap_or((&doc, ""));
    let post = rest.split_once(end).map_or("", |(_, p)| p);
    let fresh = format!("{pre}{begin}{table}{end}{post}");
    if std::env::var("BLIS_UPDATE_DOCS").is_ok() {
        std::fs::write(&doc_path, &fresh).unwrap();
        return;
    }
    if doc != fresh {
        let old: Vec<&str> = doc.lines().collect();
        let new: Vec<&str> = fresh.lines().collect();
        let diff: Vec<String> = new
            .iter()
            .filter(|l| !old.contains(l))
            .map(|l| format!("now: {l}"))
            .collect();
        panic!(
            "docs/errors.md does not match what the binaries print (BLIS_UPDATE_DOCS=1 to rewrite it):\n{}",
            diff.join("\n")
        );
    }
}

/// A number far out of range comes back in an error as the user wrote it
/// (`1e300`), not in full positional notation (`1e300` printed as 301
/// digits, `1e-300` as 300 zeros), whichever tool and input read it.
#[test]
fn a_number_far_out_of_range_is_named_short() {
    let d = tempfile::tempdir().unwrap();
    let p = |name: &str| d.path().join(name).to_str().unwrap().to_string();
    std::fs::write(p("w.yaml"), SPEC).unwrap();
    std::fs::write(
        p("neg.yaml"),
        SPEC.replace("  - id: a\n", "  - id: a\n    rate_fraction: -1e300\n"),
    )
    .unwrap();
    std::fs::write(
        p("coef.yaml"),
        "version: 1\nrows:\n  - model: \"*\"\n    gpu: H100\n    tensor_parallel: 0\n    latency_model: trained-physics\n    alpha: [0, 0, 0]\n    terms: {layer: -1e300, prefill_attention: 2.2}\n",
    )
    .unwrap();
    std::fs::write(
        p("h.yaml"),
        SPEC.replace("num_requests: 5\n", "horizon_us: 60000000\n"),
    )
    .unwrap();
    let (w, o, neg, coef) = (p("w.yaml"), p("o"), p("neg.yaml"), p("coef.yaml"));
    let h = p("h.yaml");
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "--model", MODEL, "--workload-spec", &w, "--out", &o];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("blis-replay", run(&["--horizon-s", "-1e300"]), "-1e300"),
        ("blis-replay", run(&["--horizon-s", "1e-300"]), "1e-300"),
        (
            "blis-replay",
            run(&["--gpu-memory-utilization", "1e300"]),
            "1e300",
        ),
        (
            "blis-replay",
            run(&["--client-timeout-s", "-1e300"]),
            "-1e300",
        ),
        (
            "blis-replay",
            run(&[
                "--coefficients",
                &coef,
                "--latency-model",
                "trained-physics",
            ]),
            "-1e300",
        ),
        (
            "blis-loadgen",
            [
                "generate",
                "--workload-spec",
                &w,
                "--aggregate-rate",
                "-1e300",
                "--out",
                &o,
            ]
            .map(String::from)
            .to_vec(),
            "-1e300",
        ),
        (
            // (A rate planning more requests than a run may: the count it
            // would plan is 6e301, not inf.)
            "blis-loadgen",
            [
                "generate",
                "--workload-spec",
                &h,
                "--aggregate-rate",
                "1e300",
                "--out",
                &o,
            ]
            .map(String::from)
            .to_vec(),
            "1e300 req/s over a horizon of 60 s plans about 6.000e301 requests",
        ),
        (
            "blis-loadgen",
            ["generate", "--workload-spec", &neg, "--out", &o]
                .map(String::from)
                .to_vec(),
            "-1e300",
        ),
        (
            "blis-calibrate",
            [
                "compare", "--real", &w, "--sim", &w, "--rtt-ms", "-1e300", "--out", &o,
            ]
            .map(String::from)
            .to_vec(),
            "-1e300",
        ),
    ];
    for (b, args, shown) in cases {
        let out = Command::new(bin(b)).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("{b} {}", args.join(" "));
        assert!(!out.status.success(), "{what}: accepted\n{stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("{what}: no error line\n{stderr}"));
        assert!(line.contains(&format!(" {shown}")), "{what}: {line}");
        assert!(
            !line
                .as_bytes()
                .windows(20)
                .any(|w| w.iter().all(u8::is_ascii_digit)),
            "{what}: a number of 20 digits or more: {line}"
        );
    }
}
