//! `opgraph-site`: a whole local site in one process and one command.
//!
//! The cloud on the embedded store, one gateway (with the embedded MQTT
//! broker) shipping to it over gRPC, and a simulator for each device kind
//! the gateway reads: RFID readers and a robot fleet publishing over MQTT,
//! a barcode scanner on a pseudo-terminal, a temperature sensor speaking
//! the firmware protocol on another, a PLC serving Modbus TCP. It prints the API key
//! and where to look, then a live count of events flowing, until Ctrl-C
//! stops everything cleanly. State lives in `--dir` (kept between runs:
//! the same key, the events so far, the gateway's buffer).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::barcode::BarcodeArgs;
use crate::error::{Error, Result};
use crate::firmware::FirmwareArgs;
use crate::modbus::ModbusArgs;
use crate::rfid::cli::RfidArgs;
use crate::robots::RobotsArgs;

#[derive(clap::Parser)]
struct RfidCli {
    #[command(flatten)]
    args: RfidArgs,
}

/// Where each part listens.
#[derive(Debug, Clone, clap::Args)]
pub struct SiteArgs {
    /// The site's state: cloud data, gateway buffer, configs, the API key.
    #[arg(long, default_value = "opgraph-site")]
    pub dir: PathBuf,
    /// The cloud's HTTP API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// The cloud's gRPC receiver for gateways.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub grpc: SocketAddr,
    /// The gateway's local HTTP port (health, metrics, local ingest).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub gateway_http: SocketAddr,
    /// The gateway's embedded MQTT broker.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub mqtt: SocketAddr,
    /// The simulated PLC (Modbus TCP).
    #[arg(long, default_value = "127.0.0.1:5020")]
    pub modbus: SocketAddr,
}

/// How long each part may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the site until Ctrl-C or SIGTERM.
pub async fn run(args: SiteArgs) -> Result<()> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir).map_err(Error::io("creating the site directory"))?;
    let key = site_key(dir)?;
    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(stop.clone()));

    // The cloud, then the gateway once the cloud's receiver is up.
    let cloud_config = write(dir, "cloud.toml", &cloud_toml(&args, &key))?;
    let cloud_config = opgraph_cloud::config::Config::load(Some(&cloud_config), |_| None)
        .map_err(|e| Error::InvalidConfig(vec![e.to_string()]))?;
    // Stopped in turn: the gateway first, so that it can ship what it holds.
    let (cloud_stop, gateway_stop) = (CancellationToken::new(), CancellationToken::new());
    let cloud = tokio::spawn(opgraph_cloud::server::run(cloud_config, cloud_stop.clone()));
    let cert = dir.join("cloud").join("receiver-cert.pem");
    let cloud = started("cloud", cloud, args.grpc, Some(&cert)).await?;

    let map = write(dir, "plc-map.toml", PLC_MAP)?;
    let plc = ModbusArgs {
        listen: args.modbus,
        rtu_link: None,
        map,
        exception_every: 0,
        latency: Duration::ZERO,
        disconnect_every: 0,
        crc_error_every: 0,
    };
    let plc = tokio::spawn(logged("plc", crate::modbus::run(plc)));
    wait_for(args.modbus, None).await?;

    let (scanner_link, sensor_link) = (dir.join("scanner"), dir.join("sensor"));
    let gateway_toml = gateway_toml(&args, &cert, &scanner_link, &sensor_link);
    let gateway_config = write(dir, "gateway.toml", &gateway_toml)?;
    let env_key = key.clone();
    let gateway_config = opgraph_gateway::config::Config::load(&gateway_config, move |k| {
        (k == "OPGRAPH_GATEWAY_API_KEY").then(|| env_key.clone())
    })
    .map_err(|e| Error::InvalidConfig(vec![e.to_string()]))?;
    let gateway = tokio::spawn(opgraph_gateway::app::run(gateway_config, gateway_stop.clone()));
    // The embedded broker is up before the gateway's HTTP port.
    let gateway = started("gateway", gateway, args.gateway_http, None).await?;

    // Parsed like the command line, so the simulator's defaults apply.
    let mqtt = args.mqtt.to_string();
    let readers = [
        "rfid",
        "--broker",
        &mqtt,
        "--readers",
        "3",
        "--tags",
        "40",
        "--reads",
        "1000000",
        "--rate",
        "5",
        "--timeout",
        "3650days",
        "--client-id",
        "opgraph-site-readers",
    ];
    let readers = RfidCli::try_parse_from(readers)
        .map_err(|e| Error::InvalidConfig(vec![e.to_string()]))?
        .args;
    let readers = tokio::spawn(logged("rfid readers", crate::rfid::cli::run(readers)));
    let fleet = RobotsArgs {
        broker: mqtt.clone(),
        robots: 4,
        missions: 100,
        fail_rate: 0.1,
        speed: 1.0,
        seed: None,
        timeout: Duration::from_secs(3600 * 24 * 30),
        malformed: 0,
        skewed_robots: 0,
        skew: Duration::from_secs(3600),
    };
    // A shift of 100 missions per robot, then the next one.
    let fleet = tokio::spawn(async move {
        loop {
            logged("robot fleet", crate::robots::run(fleet.clone())).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let scanner = BarcodeArgs {
        link: scanner_link,
        codes: 12,
        bad_check: 1,
        garbage: 0,
        seed: None,
        summary: None,
        send_now: true,
        exit_after_send: false,
        every: Some(Duration::from_secs(2)),
    };
    let scanner = tokio::spawn(logged("barcode scanner", crate::barcode::run(scanner)));
    // A cold-store probe sampling every two seconds, for as long as the
    // site runs.
    let sensor = FirmwareArgs {
        link: sensor_link,
        device_id: "cold-store-1".to_owned(),
        boot: None,
        readings: u32::MAX,
        window: 8,
        ack_timeout: Duration::from_millis(300),
        garbage: 0,
        seed: None,
        summary: None,
        exit_after_acked: false,
        every: Some(Duration::from_secs(2)),
    };
    let sensor = tokio::spawn(logged("temperature sensor", crate::firmware::run(sensor)));

    banner(&args, &key);
    report(&args, &key, &stop).await;

    // Ctrl-C reached the device simulators too; the gateway flushes to the
    // cloud before the cloud stops.
    println!("\nstopping ...");
    readers.abort();
    fleet.abort();
    scanner.abort();
    sensor.abort();
    let _ = tokio::time::timeout(Duration::from_secs(10), plc).await;
    gateway_stop.cancel();
    match tokio::time::timeout(Duration::from_secs(15), gateway).await {
        Ok(Ok(Ok(()))) => {}
        other => eprintln!("gateway: {other:?}"),
    }
    cloud_stop.cancel();
    match tokio::time::timeout(Duration::from_secs(15), cloud).await {
        Ok(Ok(Ok(()))) => {}
        other => eprintln!("cloud: {other:?}"),
    }
    println!("stopped; state kept in {}", args.dir.display());
    Ok(())
}

/// Runs a simulator, saying so when it fails (the site runs on without it).
async fn logged<T>(name: &str, run: impl std::future::Future<Output = Result<T>>) {
    if let Err(e) = run.await {
        eprintln!("opgraph-site: the {name} simulator stopped: {e}");
    }
}

/// The site's API key: made once, kept in the site directory.
fn site_key(dir: &Path) -> Result<String> {
    let path = dir.join("api-key");
    if let Ok(key) = std::fs::read_to_string(&path) {
        return Ok(key.trim().to_owned());
    }
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let body: String =
        (0..32).map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])).collect();
    let key = format!("og_site{body}");
    write(dir, "api-key", &key)?;
    Ok(key)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(Error::io("writing a site file"))?;
    Ok(path)
}

fn cloud_toml(args: &SiteArgs, key: &str) -> String {
    format!(
        "[http]\naddr = \"{http}\"\n\n[store]\ndata_dir = {data:?}\n\n[auth]\nbootstrap_key = \"{key}\"\n\n\
         [receivers]\ngrpc_addr = \"{grpc}\"\n",
        http = args.http,
        data = args.dir.join("cloud").display().to_string(),
        grpc = args.grpc,
    )
}

fn gateway_toml(args: &SiteArgs, cert: &Path, scanner: &Path, sensor: &Path) -> String {
    format!(
        r#"gateway_id = "site-gateway-1"

[http]
addr = "{gateway_http}"

[buffer]
dir = {buffer:?}

[uplink]
transport = "grpc"
endpoint = "{grpc}"
server_name = "localhost"
ca_file = {cert:?}

[sources.mqtt_broker]
listen = "{mqtt}"

[[sources.mqtt]]
name = "rfid-readers"
broker = "embedded"

[[sources.mqtt.rules]]
topic = "readers/{{reader}}/tags"
event = "rfid.tag.read"
actor = {{ type = "rfid_reader", id = "{{reader}}" }}
object = {{ type = "rfid_tag", id = "{{/epc}}" }}
trackable = {{ kind = "rfid_tag", code = "{{/epc}}" }}
properties = {{ antenna = "{{/antenna}}", rssi = "{{/rssi}}" }}
timestamp = "{{/ts}}"

[[sources.mqtt]]
name = "robot-fleet"
broker = "embedded"

{robot_rules}
[[sources.serial]]
name = "dock-scanner"
path = {scanner:?}
protocol = "barcode"
device = {{ type = "scanner", id = "dock-1" }}

[[sources.firmware]]
name = "cold-store-sensor"
port = {{ path = {sensor:?}, baud = 115200 }}
device_type = "sensor"

[[sources.modbus]]
name = "press-plc"
tcp = "{modbus}"
poll_interval = "2s"
device = {{ type = "plc", id = "press-4" }}

[[sources.modbus.registers]]
name = "temperature"
table = "holding_register"
address = 0
type = "f32"
order = "CDAB"
unit = "°C"

[[sources.modbus.registers]]
name = "cycles"
table = "holding_register"
address = 2
type = "u32"

[[sources.modbus.registers]]
name = "running"
table = "coil"
address = 0
"#,
        gateway_http = args.gateway_http,
        buffer = args.dir.join("gateway-buffer").display().to_string(),
        grpc = args.grpc,
        cert = cert.display().to_string(),
        mqtt = args.mqtt,
        scanner = scanner.display().to_string(),
        sensor = sensor.display().to_string(),
        modbus = args.modbus,
        robot_rules = crate::robots::GATEWAY_RULES,
    )
}

const PLC_MAP: &str = r#"[[registers]]
table = "holding_register"
address = 0
type = "f32"
order = "CDAB"
value = 71.5

[[registers]]
table = "holding_register"
address = 2
type = "u32"
value = 48213

[[registers]]
table = "coil"
address = 0
type = "bool"
value = true
"#;

/// Waits for a part to listen; when it stopped instead, its error.
async fn started<E: std::fmt::Display>(
    name: &str,
    mut task: tokio::task::JoinHandle<std::result::Result<(), E>>,
    addr: SocketAddr,
    file: Option<&Path>,
) -> Result<tokio::task::JoinHandle<std::result::Result<(), E>>> {
    tokio::select! {
        ready = wait_for(addr, file) => ready.map(|()| task),
        ended = &mut task => {
            let why = match ended {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(())) => "stopped".to_owned(),
                Err(e) => e.to_string(),
            };
            Err(Error::InvalidConfig(vec![format!("the {name} did not start: {why}")]))
        }
    }
}

/// Waits until `addr` accepts TCP connections (and `file` exists).
async fn wait_for(addr: SocketAddr, file: Option<&Path>) -> Result<()> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        let file_ready = file.is_none_or(Path::exists);
        if file_ready && tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Io {
                context: "waiting for a site part to start",
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, addr.to_string()),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn banner(args: &SiteArgs, key: &str) {
    println!(
        "\nOpgraph local site is running (state in {dir}).\n\n\
         API key:   {key}\n\
         cloud:     http://{http}   (OpenAPI: /api/openapi)\n\
         gateway:   http://{gw}/health and /metrics\n\
         devices:   3 RFID readers, 4 robots -> MQTT {mqtt}; barcode scanner -> {dir}/scanner;\n\
         \x20          temperature sensor (firmware protocol) -> {dir}/sensor; PLC -> Modbus {modbus}\n\n\
         try:       curl -s 'http://{http}/api/events?limit=5' -H 'Authorization: Bearer {key}'\n\
         \x20          or: OPGRAPH_URL=http://{http} OPGRAPH_API_KEY={key} cargo run -q --bin opgraph -- events --limit 5\n\n\
         Ctrl-C stops everything.\n",
        dir = args.dir.display(),
        http = args.http,
        gw = args.gateway_http,
        mqtt = args.mqtt,
        modbus = args.modbus,
    );
}

/// Prints the live count every two seconds until `stop`.
async fn report(args: &SiteArgs, key: &str, stop: &CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        // The cloud's series are the operator's; the site's key is its
        // bootstrap key.
        let stored = get(args.http, "/metrics", Some(key))
            .await
            .map(|m| metric_sum(&m, "opgraph_events_ingested_total"));
        let health = get(args.gateway_http, "/health", None).await;
        let buffered = health
            .as_deref()
            .and_then(|h| serde_json::from_str::<serde_json::Value>(h).ok())
            .map(|h| {
                (h["buffer"]["appended_total"].as_u64(), h["buffer"]["pending_records"].as_u64())
            });
        let line = match (stored, buffered) {
            (Some(stored), Some((Some(appended), Some(pending)))) => format!(
                "events: {appended} taken in by the gateway, {pending} waiting to ship, {stored:.0} stored in the cloud"
            ),
            _ => "events: (waiting for the site to answer)".to_owned(),
        };
        print!("\r{line}    ");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
}

/// The sum of every series of `name` in Prometheus text.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A plain HTTP/1.1 GET on loopback; the body, or `None`.
async fn get(addr: SocketAddr, path: &str, key: Option<&str>) -> Option<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let text = String::from_utf8_lossy(&response).into_owned();
        text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), fetch).await.ok().flatten()
}

async fn stop_on_signal(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    stop.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_site_configs_are_valid() {
        let args = SiteArgs {
            dir: PathBuf::from("/tmp/site"),
            http: "127.0.0.1:8080".parse().unwrap(),
            grpc: "127.0.0.1:50051".parse().unwrap(),
            gateway_http: "127.0.0.1:8081".parse().unwrap(),
            mqtt: "127.0.0.1:1883".parse().unwrap(),
            modbus: "127.0.0.1:5020".parse().unwrap(),
        };
        let key = "og_site0123456789abcdefghij0123456789";
        let cloud = opgraph_cloud::config::Config::parse(&cloud_toml(&args, key)).unwrap();
        assert_eq!(cloud.http.addr, args.http);
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("gateway.toml");
        let (cert, scanner, sensor) =
            (Path::new("/tmp/cert.pem"), Path::new("/tmp/s"), Path::new("/tmp/f"));
        std::fs::write(&path, gateway_toml(&args, cert, scanner, sensor)).unwrap();
        let gateway = opgraph_gateway::config::Config::load(&path, |k| {
            (k == "OPGRAPH_GATEWAY_API_KEY").then(|| key.to_owned())
        });
        let gateway = gateway.unwrap();
        assert_eq!(gateway.sources.firmware[0].port.path, Path::new("/tmp/f"));
        crate::modbus::Tables::from_toml(PLC_MAP).unwrap();
        assert_eq!(metric_sum("a_total{x=\"1\"} 2\na_total 3\na_totalx 9\n", "a_total"), 5.0);
    }
}
