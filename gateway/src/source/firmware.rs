//! Firmware source: a microcontroller on a serial port speaking Opgraph's
//! framed protocol (`opgraph-firmware-bridge`, `docs/firmware.md`).
//!
//! The device introduces itself (device id, boot id), then sends readings
//! numbered from 1 within its boot; the protocol's host side
//! ([`opgraph_firmware_bridge::host`]) takes them in order and makes each
//! one event. The source appends them with [`Intake::append`] and only then
//! acknowledges them, cumulatively, so the device keeps and resends
//! whatever an ack has not covered, and nothing is stored twice.
//!
//! What does not decode (noise, a broken checksum, a reading whose payload
//! or event is invalid) is counted by reason and logged; the source carries
//! on at the next frame. The port is reopened with capped backoff when it
//! goes away, as the serial source does.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use opgraph_firmware_bridge::host::{Session, Step};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::mapping::Mapped;
use super::serial::{self, PortSettings};
use super::{Intake, Source, now_ms};
use crate::backoff::Backoff;
use crate::error::Result;

/// One `[[sources.firmware]]` table: one port, one device.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirmwareSourceConfig {
    /// Name in health, metrics and logs. Required, unique.
    pub name: String,
    /// The serial port: `port = { path = "/dev/ttyACM0", baud = 115200 }`
    /// (also `data_bits`, `parity`, `stop_bits`, `flow_control`).
    pub port: PortSettings,
    /// The events' actor type; the actor id is the device id its hello
    /// gives. Default `device`.
    #[serde(default = "default_device_type")]
    pub device_type: String,
    /// Reopen backoff. Defaults `200ms` .. `10s`; each above 0, at most `1h`.
    #[serde(default = "serial::default_backoff_initial", with = "humantime_serde")]
    pub backoff_initial: Duration,
    #[serde(default = "serial::default_backoff_max", with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Device clocks further off than this are replaced by the receive
    /// time (and counted). Default `5min`.
    #[serde(default = "serial::default_skew", with = "humantime_serde")]
    pub max_clock_skew: Duration,
}

fn default_device_type() -> String {
    "device".to_owned()
}

impl FirmwareSourceConfig {
    /// Every problem, each with its key path below the table.
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> =
            self.port.problems().into_iter().map(|p| format!("port.{p}")).collect();
        if self.name.trim().is_empty() {
            problems.push("name: required".to_owned());
        }
        if self.device_type.trim().is_empty() {
            problems.push("device_type: must not be empty".to_owned());
        }
        problems.extend(crate::backoff::problems(self.backoff_initial, self.backoff_max));
        problems
    }
}

pub struct FirmwareSource {
    config: FirmwareSourceConfig,
}

impl FirmwareSource {
    pub fn new(config: &FirmwareSourceConfig) -> FirmwareSource {
        FirmwareSource { config: config.clone() }
    }
}

#[async_trait]
impl Source for FirmwareSource {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn kind(&self) -> &'static str {
        "firmware"
    }

    async fn run(self: Box<Self>, intake: Intake, shutdown: CancellationToken) -> Result<()> {
        let config = self.config;
        let health = Arc::clone(intake.health());
        let mut backoff = Backoff::new(config.backoff_initial, config.backoff_max);
        let mut buf = vec![0u8; 4096];
        let mut session = Session::new(&config.device_type);
        'reopen: loop {
            let Some(mut port) =
                serial::open_port(&config.port, &config.name, &health, &mut backoff, &shutdown)
                    .await
            else {
                break 'reopen;
            };
            session.reopened();
            loop {
                let n = tokio::select! {
                    read = port.read(&mut buf) => match read {
                        Ok(n) if n > 0 => n,
                        result => {
                            if serial::port_lost(&config.port, &config.name, result, &health, &mut backoff, &shutdown).await {
                                continue 'reopen;
                            }
                            break 'reopen;
                        }
                    },
                    () = shutdown.cancelled() => break 'reopen,
                };
                let now = now_ms();
                health.received(now);
                backoff.reset();
                let step = session.feed(&buf[..n]);
                let answer = settle(&intake, &mut session, step, &config.name).await;
                if !answer.is_empty()
                    && let Err(e) = port.write_all(&answer).await
                {
                    tracing::warn!(source = %config.name, error = %e, "firmware ack not sent; the device will resend");
                }
            }
        }
        health.set_connected(false);
        Ok(())
    }
}

/// Counts rejections, appends the readings durably, and returns the
/// frames to answer with: an ack only for what is now stored.
async fn settle(intake: &Intake, session: &mut Session, step: Step, source: &str) -> Vec<u8> {
    let now = now_ms();
    for (reason, why) in &step.rejected {
        intake.health().reject(reason, why, now);
    }
    let records: Vec<Bytes> = step
        .readings
        .iter()
        .filter_map(|t| {
            let mapped = Mapped { envelope: t.envelope.clone(), device_time_ms: t.device_time_ms };
            intake.prepare(Ok(mapped), now)
        })
        .collect();
    if !records.is_empty() {
        let n = records.len();
        if let Err(e) = intake.append(records).await {
            session.not_stored();
            tracing::error!(%source, error = %e, events = n, "firmware readings not buffered; the device will resend them");
            return Vec::new();
        }
    }
    session.stored(&step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_name_their_keys() {
        let config: FirmwareSourceConfig = toml::from_str(
            "name = \"\"\nport = { path = \"/dev/null\", baud = 0 }\ndevice_type = \" \"\n",
        )
        .unwrap();
        let problems = config.problems();
        for key in ["port.baud:", "name:", "device_type:"] {
            assert!(problems.iter().any(|p| p.starts_with(key)), "{key} in {problems:?}");
        }
        let unknown = "name = \"f\"\nport = { path = \"x\" }\nspeed = 1\n";
        assert!(toml::from_str::<FirmwareSourceConfig>(unknown).is_err());
    }
}
