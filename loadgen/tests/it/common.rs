use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use blis_mockserver::RunningServer;
use blis_mockserver::server::Served;
use clap::Parser;

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Tests that measure time run one at a time, so that no other test's
/// load skews what they measure.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `blis-mockserver` on port 0 in a runtime of its own, recording what it
/// served.
pub struct Mock {
    rt: tokio::runtime::Runtime,
    server: Option<RunningServer>,
    pub url: String,
}

impl Mock {
    pub fn start(extra: &[&str]) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut args = vec!["blis-mockserver", "--record-served"];
        if !extra.contains(&"--port") {
            args.extend(["--port", "0"]);
        }
        args.extend_from_slice(extra);
        let opts = blis_mockserver::Opts::parse_from(args);
        let server = rt
            .block_on(blis_mockserver::start(&opts.config()))
            .expect("mock starts");
        let url = format!("http://{}", server.addr);
        Self {
            rt,
            server: Some(server),
            url,
        }
    }

    pub fn served(&self) -> Vec<Served> {
        self.server
            .as_ref()
            .and_then(|s| s.served.as_ref())
            .map(|l| l.entries())
            .unwrap_or_default()
    }

    pub fn faults(&self, kind: &str) -> u64 {
        self.server.as_ref().map_or(0, |s| s.metrics.faults(kind))
    }
}

#[allow(dead_code, reason = "used by the signal test binary only")]
impl Mock {
    /// The server dies at once, as a killed process does: its runtime is
    /// dropped with every task (connections and streams cut, the port
    /// closed) instead of shutting down gracefully.
    pub fn kill(mut self) {
        drop(self.server.take());
        let rt = std::mem::replace(
            &mut self.rt,
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
        );
        rt.shutdown_background();
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
        }
    }
}

/// Runs `blis-loadgen ARGS` in this process; returns its exit code and
/// stdout.
pub fn loadgen(args: &[&str]) -> anyhow::Result<(i32, String)> {
    let mut argv = vec!["blis-loadgen"];
    argv.extend_from_slice(args);
    let opts = blis_loadgen::Opts::try_parse_from(argv)?;
    let mut out = Vec::new();
    let code = blis_loadgen::run(opts, &mut out)?;
    Ok((code, String::from_utf8(out)?))
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// How a hand-written test server answers a POST.
#[derive(Clone, Copy)]
pub enum PostReply {
    /// A 501 HTML page, as `python3 -m http.server` does.
    Unsupported,
    /// Read and never answered (the connection stays open until the client
    /// closes it): a server wedged behind a live socket.
    Silent,
    /// `200 OK` with this content type and body, whatever was asked.
    Ok(&'static str, &'static str),
    /// `200 OK`, an event stream with this text, and then nothing: the
    /// chunked body is never ended and the connection stays open.
    StreamThenHang(&'static str),
    /// As `Ok` for POSTs, and every GET a `200 OK` HTML page (a gateway's
    /// catch-all page).
    OkWithPageGets(&'static str, &'static str),
    /// As `Ok` for POSTs; a GET of `/metrics` a `200 OK` plain-text page
    /// with this text (other GETs a 404 page).
    OkWithMetricsGets(&'static str, &'static str, &'static str),
    /// As `Ok` for POSTs, and every GET a `200 OK` JSON body that never
    /// ends (`[` and then spaces, for as long as the client reads).
    OkWithEndlessGets(&'static str, &'static str),
    /// Every POST an `HTTP 500` whose body never ends (the same line
    /// repeated for as long as the client reads).
    EndlessError,
    /// Every request, GET or POST, a `200 OK` head and then nothing (the
    /// connection stays open until the client closes it).
    HeadersThenStall,
    /// Every POST an event stream of one-token chunks that never ends (a
    /// server that ignores `max_tokens`), as fast as the client reads.
    Flood,
}

/// Writes a whole `200 OK` response with `body` and closes.
fn reply_200(mut conn: std::net::TcpStream, content_type: &str, body: &str) {
    use std::io::Write;
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

/// A server that is not OpenAI-compatible, answering like
/// `python3 -m http.server`: GET gets a 404 page, POST a 501 page (HTML);
/// with `silent_posts`, POSTs are never answered ([`PostReply::Silent`]).
/// The receiver gets one message per POST read.
pub fn start_http_server(silent_posts: bool) -> (String, std::sync::mpsc::Receiver<()>) {
    start_server_replying(if silent_posts {
        PostReply::Silent
    } else {
        PostReply::Unsupported
    })
}

/// A server whose GETs get a 404 page and whose POSTs get `reply`; the
/// receiver gets one message per POST read.
pub fn start_server_replying(reply: PostReply) -> (String, std::sync::mpsc::Receiver<()>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (posts, posted) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let posts = posts.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn);
                let mut first = String::new();
                if r.read_line(&mut first).is_err() {
                    return;
                }
                let mut len = 0usize;
                loop {
                    let mut l = String::new();
                    if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                        break;
                    }
                    if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body);
                let post = first.starts_with("POST");
                if post {
                    let _ = posts.send(());
                }
                match reply {
                    PostReply::Silent if post => {
                        let _ = r.read_to_end(&mut body);
                        return;
                    }
                    PostReply::Ok(content_type, text)
                    | PostReply::OkWithEndlessGets(content_type, text)
                    | PostReply::OkWithMetricsGets(content_type, text, _)
                        if post =>
                    {
                        reply_200(r.into_inner(), content_type, text);
                        return;
                    }
                    PostReply::OkWithPageGets(content_type, text) => {
                        let (content_type, text) = if post {
                            (content_type, text)
                        } else {
                            (
                                "text/html",
                                "<html><body>Welcome to the gateway</body></html>",
                            )
                        };
                        reply_200(r.into_inner(), content_type, text);
                        return;
                    }
                    PostReply::OkWithMetricsGets(_, _, page)
                        if first.split_whitespace().nth(1) == Some("/metrics") =>
                    {
                        reply_200(r.into_inner(), "text/plain; version=0.0.4", page);
                        return;
                    }
                    PostReply::OkWithEndlessGets(..) => {
                        let mut conn = r.into_inner();
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n["
                        );
                        let spaces = [b' '; 1 << 16];
                        while conn.write_all(&spaces).is_ok() {}
                        return;
                    }
                    PostReply::HeadersThenStall => {
                        let mut conn = r.into_inner();
                        let content_type = if post {
                            "text/event-stream"
                        } else {
                            "application/json"
                        };
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: 100\r\n\r\n"
                        );
                        let _ = conn.flush();
                        let mut rest = Vec::new();
                        let _ = conn.read_to_end(&mut rest);
                        return;
                    }
                    PostReply::EndlessError if post => {
                        let mut conn = r.into_inner();
                        let _ = write!(
                            conn,
                            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                        );
                        let line = b"out of memory; out of memory; out of memory\n".repeat(1024);
                        while conn.write_all(&line).is_ok() {}
                        return;
                    }
                    PostReply::Flood if post => {
                        let mut conn = r.into_inner();
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                        );
                        let chunk = b"data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n".repeat(256);
                        while conn.write_all(&chunk).is_ok() {}
                        return;
                    }
                    PostReply::StreamThenHang(text) if post => {
                        let mut conn = r.into_inner();
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{text}\r\n",
                            text.len()
                        );
                        let _ = conn.flush();
                        let mut rest = Vec::new();
                        let _ = conn.read_to_end(&mut rest);
                        return;
                    }
                    _ => {}
                }
                let (code, reason, msg) = if post {
                    (
                        501,
                        "Unsupported method ('POST')",
                        "Unsupported method ('POST')",
                    )
                } else {
                    (404, "File not found", "File not found")
                };
                let page = format!(
                    "<!DOCTYPE HTML>\n<html lang=\"en\">\n    <head>\n        <meta charset=\"utf-8\">\n        <title>Error response</title>\n    </head>\n    <body>\n        <h1>Error response</h1>\n        <p>Error code: {code}</p>\n        <p>Message: {msg}.</p>\n        <p>Error code explanation: {code} - {}.</p>\n    </body>\n</html>\n",
                    "x".repeat(400)
                );
                let mut conn = r.into_inner();
                let _ = write!(
                    conn,
                    "HTTP/1.0 {code} {reason}\r\nServer: SimpleHTTP/0.6 Python/3.11.7\r\nContent-Type: text/html;charset=utf-8\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{page}",
                    page.len()
                );
            });
        }
    });
    (url, posted)
}
