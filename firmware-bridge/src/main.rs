//! `opgraph-firmware-bridge`: a microcontroller on a serial port, its
//! readings posted to a gateway's local ingest endpoint.
//!
//! For a device wired to a machine that does not run the gateway (a
//! single-board computer by the line, the gateway in the site's rack). The
//! bridge runs the same host side of the protocol as the gateway's
//! `firmware` source and acknowledges a reading only after the gateway
//! answered 202, which it does once the events are durable in its buffer:
//! the device resends whatever the bridge could not deliver. A batch the
//! gateway refuses as invalid is sent again one event at a time, so that
//! one bad reading cannot hold up the others; each refused one is logged,
//! counted and acknowledged (it would never be accepted).
//!
//! The event time is the gateway's receive time; the device's clock, when
//! it sends one, is kept in `context.deviceTimestamp`. It prints
//! `summary {json}` (counts) on stdout when it stops (SIGTERM, Ctrl-C).
//! A gateway that refuses its token (401) stops it with an error: nothing
//! but a new token mends that, and the device keeps what was not
//! acknowledged.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use opgraph_firmware_bridge::host::{Session, Step};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

/// Most events in one post (the ingest endpoint's limit).
const MAX_BATCH: usize = 1000;

/// Bridge a microcontroller on a serial port to an Opgraph gateway.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The device's serial port, e.g. /dev/ttyACM0.
    #[arg(long)]
    port: PathBuf,
    #[arg(long, default_value_t = 115_200)]
    baud: u32,
    /// The gateway's local HTTP address, e.g. http://10.0.0.5:8081.
    #[arg(long)]
    gateway: String,
    /// The events' actor type; the actor id is the device's own.
    #[arg(long, default_value = "device")]
    device_type: String,
    /// The bearer token of a gateway that asks for one
    /// (`http.ingest_token_sha256`). Best given by the environment:
    /// arguments show in the process list.
    #[arg(long, env = "OPGRAPH_GATEWAY_INGEST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Time limit of one post to the gateway.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// What the bridge did, for the summary.
#[derive(Debug, Default)]
struct Counts {
    readings: u64,
    posts: u64,
    failed_posts: u64,
    refused: u64,
    rejected: BTreeMap<&'static str, u64>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OPGRAPH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let endpoint = match url(&args.gateway) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            eprintln!("--gateway: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(&args, &endpoint).await {
        Ok(counts) => {
            let rejected: serde_json::Map<String, Value> =
                counts.rejected.iter().map(|(k, v)| ((*k).to_owned(), Value::from(*v))).collect();
            println!(
                "summary {}",
                json!({"readings": counts.readings, "posts": counts.posts,
                    "failedPosts": counts.failed_posts, "refused": counts.refused,
                    "rejected": rejected})
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("opgraph-firmware-bridge: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The ingest URL of a gateway address, `http://host:port`: the
/// gateway's local port speaks plain HTTP, on the site's network.
fn url(gateway: &str) -> Result<String, String> {
    let base = gateway.trim().trim_end_matches('/');
    let rest = base.strip_prefix("http://").ok_or("must start with http://")?;
    if rest.is_empty() || rest.contains('/') {
        return Err("give the gateway's address only, e.g. http://10.0.0.5:8081".to_owned());
    }
    Ok(format!("{base}/ingest"))
}

async fn run(args: &Args, endpoint: &str) -> Result<Counts, String> {
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let client =
        reqwest::Client::builder().timeout(args.timeout).build().map_err(|e| e.to_string())?;
    let mut session = Session::new(&args.device_type);
    let mut counts = Counts::default();
    let mut buf = vec![0u8; 4096];
    let mut wait = Duration::from_millis(200);
    'reopen: loop {
        let port = tokio_serial::new(args.port.to_string_lossy(), args.baud);
        let mut port = match tokio_serial::SerialStream::open(&port) {
            Ok(port) => port,
            Err(e) => {
                tracing::warn!(port = %args.port.display(), error = %e, "cannot open the port; retrying");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = terminate.recv() => break 'reopen,
                    _ = interrupt.recv() => break 'reopen,
                }
                wait = (wait * 2).min(Duration::from_secs(10));
                continue 'reopen;
            }
        };
        wait = Duration::from_millis(200);
        session.reopened();
        tracing::info!(port = %args.port.display(), gateway = %endpoint, "bridging");
        loop {
            let n = tokio::select! {
                read = port.read(&mut buf) => match read {
                    Ok(n) if n > 0 => n,
                    result => {
                        let why = result.err().map_or_else(|| "closed".to_owned(), |e| e.to_string());
                        tracing::warn!(error = %why, "the port went away; reopening");
                        continue 'reopen;
                    }
                },
                _ = terminate.recv() => break 'reopen,
                _ = interrupt.recv() => break 'reopen,
            };
            let step = session.feed(&buf[..n]);
            for (reason, why) in &step.rejected {
                *counts.rejected.entry(reason).or_default() += 1;
                tracing::warn!(reason, "input rejected: {why}");
            }
            if !deliver(&client, endpoint, args.token.as_deref(), &step, &mut counts).await? {
                session.not_stored();
                continue;
            }
            let answer = session.stored(&step);
            if !answer.is_empty()
                && let Err(e) = port.write_all(&answer).await
            {
                tracing::warn!(error = %e, "ack not sent; the device will resend");
            }
        }
    }
    Ok(counts)
}

/// Posts `step`'s readings; `true` when the gateway holds every one it
/// will ever accept, an error when it refuses the bridge.
async fn deliver(
    client: &reqwest::Client,
    endpoint: &str,
    token: Option<&str>,
    step: &Step,
    counts: &mut Counts,
) -> Result<bool, String> {
    let events: Vec<Value> = step
        .readings
        .iter()
        .map(|taken| {
            let mut envelope = taken.envelope.clone();
            if let Some(device_ms) = taken.device_time_ms {
                envelope.insert("context".to_owned(), json!({"deviceTimestamp": device_ms}));
            }
            Value::Object(envelope)
        })
        .collect();
    let mut refused = 0;
    for batch in events.chunks(MAX_BATCH) {
        match post(client, endpoint, token, &json!({"batch": batch}), counts).await? {
            Posted::Stored => {}
            Posted::Failed => return Ok(false),
            // One invalid event refuses the batch: find it, keep the rest.
            Posted::Refused => {
                for event in batch {
                    match post(client, endpoint, token, event, counts).await? {
                        Posted::Stored => {}
                        Posted::Failed => return Ok(false),
                        Posted::Refused => refused += 1,
                    }
                }
            }
        }
    }
    counts.refused += refused;
    counts.readings += events.len() as u64 - refused;
    Ok(true)
}

enum Posted {
    /// 202: durable in the gateway's buffer.
    Stored,
    /// 400/413/415: never accepted as it is.
    Refused,
    /// No answer, or the gateway cannot take it now.
    Failed,
}

/// One post; an error when the gateway refuses the bridge's token.
async fn post(
    client: &reqwest::Client,
    endpoint: &str,
    token: Option<&str>,
    body: &Value,
    counts: &mut Counts,
) -> Result<Posted, String> {
    counts.posts += 1;
    let mut request = client.post(endpoint).json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) => {
            counts.failed_posts += 1;
            tracing::warn!(error = %e, "the gateway did not answer; the device will resend");
            return Ok(Posted::Failed);
        }
    };
    let status = response.status();
    if status.is_success() {
        return Ok(Posted::Stored);
    }
    let text = response.text().await.unwrap_or_default();
    if status.as_u16() == 401 {
        let given = if token.is_some() { "refused the token" } else { "asks for a token" };
        return Err(format!(
            "the gateway {given} (set OPGRAPH_GATEWAY_INGEST_TOKEN to one it accepts): {text}"
        ));
    }
    if matches!(status.as_u16(), 400 | 413 | 415) {
        tracing::warn!(%status, answer = %text, "the gateway refused the readings");
        return Ok(Posted::Refused);
    }
    counts.failed_posts += 1;
    tracing::warn!(%status, answer = %text, "the gateway could not take the readings; the device will resend");
    Ok(Posted::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_address_is_checked() {
        assert_eq!(url("http://10.0.0.5:8081/").unwrap(), "http://10.0.0.5:8081/ingest");
        assert!(url("10.0.0.5:8081").is_err());
        assert!(url("http://10.0.0.5:8081/ingest").is_err());
        assert!(url("http://").is_err());
        assert!(url("https://10.0.0.5:8081").is_err(), "the local port is plain HTTP");
    }
}
