//! Modbus polling benchmark (`cargo bench -p opgraph-tests --bench modbus`,
//! after `cargo build --release --bins`).
//!
//! 100 devices × 20 holding registers, all served by one `opgraph-sim
//! modbus` process over TCP on loopback (one connection per device).
//! Baseline, in the same run: a bare tokio-modbus client per device reading
//! the same 20 registers in a loop, as fast as the simulator answers (the
//! raw limit of simulator plus protocol on this machine). Opgraph: one
//! gateway with 100 `[[sources.modbus]]` sources polling every millisecond
//! (so: as fast as each device answers), each poll decoded into a
//! `sensor.reading` and appended durably to the buffer (the uplink points
//! nowhere, so the cloud takes no CPU). Polls/s are counted from the
//! sources' `received_total` over the measured window.
//!
//! Options (after `--`): `--devices=N` (100), `--seconds=N` (5),
//! `--rounds=N` (2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use opgraph_tests::Process;
use opgraph_tests::edge::{Gateway, Transport, gateway_config};
use tokio_modbus::client::Reader;

const REGISTERS: u16 = 20;

struct Options {
    devices: usize,
    seconds: u64,
    rounds: usize,
}

fn options() -> Options {
    let mut o = Options { devices: 100, seconds: 5, rounds: 2 };
    for arg in std::env::args().skip(1) {
        let (k, v) = arg.split_once('=').unwrap_or((arg.as_str(), ""));
        match k {
            "--devices" => o.devices = v.parse().expect("--devices=N"),
            "--seconds" => o.seconds = v.parse().expect("--seconds=N"),
            "--rounds" => o.rounds = v.parse().expect("--rounds=N"),
            "--bench" => {}
            other => panic!("unknown option {other} (see the header of benches/modbus.rs)"),
        }
    }
    o
}

/// Every device's client reading all registers in a loop; polls/s.
async fn baseline(addr: SocketAddr, devices: usize, measure: Duration) -> f64 {
    let deadline = Instant::now() + measure;
    let mut tasks = Vec::new();
    for unit in 0..devices {
        tasks.push(tokio::spawn(async move {
            let slave = tokio_modbus::Slave(u8::try_from(unit % 247 + 1).unwrap());
            let mut ctx = tokio_modbus::client::tcp::connect_slave(addr, slave).await.unwrap();
            let mut polls = 0u64;
            while Instant::now() < deadline {
                ctx.read_holding_registers(0, REGISTERS).await.unwrap().unwrap();
                polls += 1;
            }
            polls
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / measure.as_secs_f64()
}

fn sources(addr: SocketAddr, devices: usize) -> String {
    let mut text = String::new();
    for d in 0..devices {
        write!(
            text,
            "\n[[sources.modbus]]\nname = \"plc-{d}\"\ntcp = \"{addr}\"\npoll_interval = \"1ms\"\n\
             device = {{ type = \"plc\", id = \"plc-{d}\" }}\n"
        )
        .unwrap();
        for r in 0..REGISTERS {
            write!(
                text,
                "[[sources.modbus.registers]]\nname = \"r{r}\"\ntable = \"holding_register\"\naddress = {r}\n"
            )
            .unwrap();
        }
    }
    text
}

async fn polls_so_far(gateway: &Gateway) -> u64 {
    let health = gateway.health().await;
    health["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["received_total"].as_u64().unwrap())
        .sum()
}

/// The gateway polling every device; polls/s over the measured window.
async fn gateway_rate(
    dir: &std::path::Path,
    addr: SocketAddr,
    devices: usize,
    measure: Duration,
) -> f64 {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.cert.pem()).unwrap();
    let config = gateway_config(dir, Transport::Grpc, "127.0.0.1:9", &ca, &sources(addr, devices));
    let gateway = Gateway::start(&config, opgraph_tests::TEST_BOOTSTRAP_KEY).await;
    // Warm up: every source connected and polling.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (t0, p0) = (Instant::now(), polls_so_far(&gateway).await);
    tokio::time::sleep(measure).await;
    let (t1, p1) = (Instant::now(), polls_so_far(&gateway).await);
    gateway.process.kill9().await.unwrap();
    (p1 - p0) as f64 / (t1 - t0).as_secs_f64()
}

fn main() {
    let o = options();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let map = tmp.path().join("map.toml");
        let mut text = String::new();
        for r in 0..REGISTERS {
            write!(text, "[[registers]]\ntable = \"holding_register\"\naddress = {r}\ntype = \"u16\"\nvalue = {}\n\n", r * 100).unwrap();
        }
        std::fs::write(&map, text).unwrap();
        let map = map.display().to_string();
        let args = ["modbus", "--listen", "127.0.0.1:0", "--map", &map];
        let sim = Process::start("opgraph-sim", &args, &[], &["modbus"]).await.unwrap();
        let addr: SocketAddr = sim.addrs["modbus"].parse().unwrap();
        let measure = Duration::from_secs(o.seconds);
        println!(
            "opgraph modbus benchmark: {} devices x {REGISTERS} holding registers, one simulator on {addr}, {}s per side",
            o.devices, o.seconds
        );
        println!("  round  bare client polls/s  gateway polls/s  ratio");
        let mut ratios = Vec::new();
        for round in 0..o.rounds {
            let dir = tmp.path().join(format!("gw-{round}"));
            std::fs::create_dir_all(&dir).unwrap();
            let (base, ours) = if round % 2 == 0 {
                let b = baseline(addr, o.devices, measure).await;
                (b, gateway_rate(&dir, addr, o.devices, measure).await)
            } else {
                let g = gateway_rate(&dir, addr, o.devices, measure).await;
                (baseline(addr, o.devices, measure).await, g)
            };
            println!("  {:>5}  {base:>19.0}  {ours:>15.0}  {:>5.2}", round + 1, ours / base);
            ratios.push(ours / base);
        }
        ratios.sort_by(f64::total_cmp);
        println!("  median ratio {:.2}", ratios[ratios.len() / 2]);
        sim.terminate().await.unwrap();
    });
}
