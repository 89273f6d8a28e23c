use std::time::Instant;

use blis_mockserver::{Opts, RunningServer, start};
use clap::Parser;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::Value;

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

pub async fn server(extra: &[&str]) -> (RunningServer, String) {
    let mut args = vec!["blis-mockserver", "--port", "0"];
    args.extend_from_slice(extra);
    let s = start(&Opts::parse_from(args).config())
        .await
        .expect("server starts");
    let url = format!("http://{}", s.addr);
    (s, url)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A streamed response as the client saw it.
#[derive(Debug)]
pub struct Streamed {
    pub status: u16,
    pub events: Vec<String>,
    pub times: Vec<Instant>,
    pub error: Option<String>,
}

impl Streamed {
    pub fn json(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| *e != "[DONE]")
            .filter_map(|e| serde_json::from_str(e).ok())
            .collect()
    }
}

pub async fn stream(url: &str, path: &str, body: Value) -> Streamed {
    stream_with(&client(), url, path, body).await
}

pub async fn stream_with(c: &reqwest::Client, url: &str, path: &str, body: Value) -> Streamed {
    stream_with_id(c, url, path, body, None).await
}

/// [`stream_with`], sending `x-request-id` when given.
pub async fn stream_with_id(
    c: &reqwest::Client,
    url: &str,
    path: &str,
    body: Value,
    x_request_id: Option<&str>,
) -> Streamed {
    let mut req = c.post(format!("{url}{path}")).json(&body);
    if let Some(id) = x_request_id {
        req = req.header("x-request-id", id);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let mut s = resp.bytes_stream().eventsource();
    let (mut events, mut times, mut error) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = s.next().await {
        match ev {
            Ok(ev) => {
                times.push(Instant::now());
                events.push(ev.data);
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    Streamed {
        status,
        events,
        times,
        error,
    }
}
