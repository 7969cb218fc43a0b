//! `opgraph-sim barcode`: a barcode scanner on a serial line.
//!
//! Makes a pseudo-terminal pair (the scanner holds the master end), links
//! `--link PATH` to the other end for the gateway to open, prints
//! `listening serial=PATH` and, on SIGUSR1 (or at once with `--send-now`),
//! writes a seeded [`plan`] of CR LF-terminated lines: GS1-128 codes with
//! AIM identifier `]C1` (GTIN, expiry, batch, serial), Code 128 pallet
//! labels (`]C0`), EAN-13 (`]E0`), and on request GS1 codes with a wrong
//! check digit and garbage lines. Then it writes `summary {json}` on stdout
//! (and to `--summary FILE`): the trackable code of every valid line in
//! order, and the counts. It keeps the line open until SIGTERM or Ctrl-C;
//! `--exit-after-send` closes it at once instead (an unplugged scanner).

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};

use opgraph_gateway::source::serial::barcode;

use crate::error::{Error, Result};
use crate::print;

/// Simulate a barcode scanner on a pseudo-terminal.
#[derive(Debug, Clone, clap::Args)]
pub struct BarcodeArgs {
    /// Symlink to create to the scanner's serial device.
    #[arg(long)]
    pub link: PathBuf,
    /// Valid codes to send.
    #[arg(long, default_value_t = 20)]
    pub codes: usize,
    /// GS1 codes with a wrong check digit to mix in.
    #[arg(long, default_value_t = 0)]
    pub bad_check: usize,
    /// Garbage lines (control bytes, invalid UTF-8) to mix in.
    #[arg(long, default_value_t = 0)]
    pub garbage: usize,
    /// Seed [default: random, printed in the summary].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Also write the summary to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Send at once instead of waiting for SIGUSR1.
    #[arg(long)]
    pub send_now: bool,
    /// Close the line and exit after sending.
    #[arg(long)]
    pub exit_after_send: bool,
    /// Keep scanning: one line every interval (e.g. 2s), the plan over
    /// and over with a new seed each round, until stopped.
    #[arg(long, value_parser = crate::parse_duration)]
    pub every: Option<std::time::Duration>,
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Without the CR LF.
    pub bytes: Vec<u8>,
    /// The trackable code the gateway should derive; `None` for lines it
    /// must reject.
    pub code: Option<String>,
}

/// The GS1 check digit of `body`, all digits by construction.
fn check_digit(body: &str) -> u32 {
    barcode::check_digit(body).unwrap_or(0)
}

fn digits(rng: &mut StdRng, n: usize) -> String {
    (0..n).map(|_| char::from(b'0' + rng.random_range(0..10u8))).collect()
}

/// The lines to send, valid ones first in a seeded shuffle with the rest.
pub fn plan(seed: u64, codes: usize, bad_check: usize, garbage: usize) -> Vec<Line> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut lines = Vec::new();
    for i in 0..codes {
        let line = match i % 3 {
            0 => {
                let body = format!("0{}", digits(&mut rng, 12));
                let gtin = format!("{body}{}", check_digit(&body));
                let expiry = format!(
                    "{:02}{:02}{:02}",
                    rng.random_range(25..40),
                    rng.random_range(1..13),
                    rng.random_range(1..29)
                );
                let batch = format!("B{}", digits(&mut rng, 5));
                let serial = format!("S{i}");
                Line {
                    bytes: format!("]C101{gtin}17{expiry}10{batch}\u{1d}21{serial}").into_bytes(),
                    code: Some(format!("{gtin}.{serial}")),
                }
            }
            1 => {
                let label = format!("PALLET-{:05}", rng.random_range(0..100_000));
                Line { bytes: format!("]C0{label}").into_bytes(), code: Some(label) }
            }
            _ => {
                let body = digits(&mut rng, 12);
                let ean = format!("{body}{}", check_digit(&body));
                Line { bytes: format!("]E0{ean}").into_bytes(), code: Some(ean) }
            }
        };
        lines.push(line);
    }
    for _ in 0..bad_check {
        let body = format!("0{}", digits(&mut rng, 12));
        let wrong = (check_digit(&body) + 1 + rng.random_range(0..9)) % 10;
        let bytes = format!("]C101{body}{wrong}").into_bytes();
        let at = rng.random_range(0..=lines.len());
        lines.insert(at, Line { bytes, code: None });
    }
    for _ in 0..garbage {
        let mut bytes: Vec<u8> = (0..rng.random_range(3..20))
            .map(|_| [0x01, 0x07, 0x1b, 0xfe, 0xff, b'A'][rng.random_range(0..6)])
            .collect();
        bytes.push(0xff); // never a valid line by chance
        let at = rng.random_range(0..=lines.len());
        lines.insert(at, Line { bytes, code: None });
    }
    lines
}

/// Runs the scanner; see the module docs. Returns the summary.
pub async fn run(args: BarcodeArgs) -> Result<Value> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let lines = plan(seed, args.codes, args.bad_check, args.garbage);
    let (mut scanner, _line_end) = crate::linked_pty(&args.link)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::io("SIGTERM handler"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::io("SIGINT handler"))?;
    let mut go = signal(SignalKind::user_defined1()).map_err(Error::io("SIGUSR1 handler"))?;
    print(&format!("listening serial={}\n", args.link.display()))?;
    let started = args.send_now
        || tokio::select! {
            _ = go.recv() => true,
            _ = terminate.recv() => false,
            _ = interrupt.recv() => false,
        };
    let mut summary = Value::Null;
    if let (true, Some(every)) = (started, args.every) {
        let mut tick = tokio::time::interval(every);
        let mut round = 0;
        loop {
            let lines = plan(seed.wrapping_add(round), args.codes, args.bad_check, args.garbage);
            for line in lines {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = terminate.recv() => return finish(&args.link, summary),
                    _ = interrupt.recv() => return finish(&args.link, summary),
                }
                let mut bytes = line.bytes;
                bytes.extend_from_slice(b"\r\n");
                AsyncWriteExt::write_all(&mut scanner, &bytes)
                    .await
                    .map_err(Error::io("writing to the pty"))?;
            }
            round += 1;
            summary = json!({"seed": seed, "rounds": round});
        }
    }
    if started {
        for line in &lines {
            let mut bytes = line.bytes.clone();
            bytes.extend_from_slice(b"\r\n");
            AsyncWriteExt::write_all(&mut scanner, &bytes)
                .await
                .map_err(Error::io("writing to the pty"))?;
        }
        AsyncWriteExt::flush(&mut scanner).await.map_err(Error::io("writing to the pty"))?;
        let codes: Vec<&str> = lines.iter().filter_map(|l| l.code.as_deref()).collect();
        summary = json!({
            "seed": seed, "sent": lines.len(), "valid": codes.len(),
            "bad_check": args.bad_check, "garbage": args.garbage, "codes": codes,
        });
        if let Some(path) = &args.summary {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, summary.to_string())
                .and_then(|()| std::fs::rename(&tmp, path))
                .map_err(Error::io("writing the summary"))?;
        }
        print(&format!("summary {summary}\n"))?;
        if !args.exit_after_send {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        }
    }
    finish(&args.link, summary)
}

fn finish(link: &std::path::Path, summary: Value) -> Result<Value> {
    let _ = std::fs::remove_file(link);
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_seeded_and_its_codes_are_valid_gs1_where_claimed() {
        let a = plan(7, 9, 2, 2);
        assert_eq!(a, plan(7, 9, 2, 2));
        assert_eq!(a.len(), 13);
        assert_eq!(a.iter().filter(|l| l.code.is_some()).count(), 9);
        for line in &a {
            let text = String::from_utf8_lossy(&line.bytes);
            assert!(!text.contains(['\r', '\n']), "{text:?}");
            if let Some(gtin) = text.strip_prefix("]C101").map(|r| &r[..14]) {
                let ok = check_digit(&gtin[..13]) == u32::from(gtin.as_bytes()[13] - b'0');
                assert_eq!(ok, line.code.is_some(), "{text}");
            }
        }
    }
}
