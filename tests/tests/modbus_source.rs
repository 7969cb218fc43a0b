//! Modbus source end to end: `opgraph-sim modbus` serves a register map
//! over Modbus TCP (and RTU on a pseudo-terminal), the gateway polls it and the cloud's API is checked for
//! the exact decoded values (every type, every byte/word order, scale and
//! units). Beside it the same gateway polls a device that answers every
//! other request with an exception and a device that is not there: both
//! are counted in health, and neither stalls the good one.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::Path;

use opgraph_tests::edge::*;
use opgraph_tests::{Process, TEST_BOOTSTRAP_KEY};
use serde_json::{Value, json};

/// The simulator's map: each entry also goes into the gateway's register
/// map under `name`, with the same type and order.
const ENTRIES: &[(&str, &str, u16, &str, &str, &str)] = &[
    // name, table, address, type, order, value
    ("temperature", "holding_register", 0, "f32", "CDAB", "21.5"),
    ("cycles", "holding_register", 2, "u32", "DCBA", "305419896"),
    ("offset_c", "holding_register", 4, "i16", "ABCD", "-40"),
    ("energy_wh", "holding_register", 5, "u64", "BADC", "1234567890123"),
    ("pressure", "holding_register", 9, "f64", "DCBA", "3.25"),
    ("drift", "holding_register", 13, "i64", "CDAB", "-123456789012"),
    ("label", "holding_register", 20, "string", "ABCD", "\"PRESS-4\""),
    ("raw_speed", "input_register", 0, "u16", "ABCD", "1234"),
    ("alarm", "discrete_input", 7, "bool", "ABCD", "false"),
    ("running", "coil", 3, "bool", "ABCD", "true"),
];

fn write_map(path: &Path) {
    let mut text = String::new();
    for (_, table, address, ty, order, value) in ENTRIES {
        let length = if *ty == "string" { "length = 4\n" } else { "" };
        text.push_str(&format!(
            "[[registers]]\ntable = \"{table}\"\naddress = {address}\ntype = \"{ty}\"\n\
             order = \"{order}\"\n{length}value = {value}\n\n"
        ));
    }
    std::fs::write(path, text).unwrap();
}

/// One `[[sources.modbus]]` table reaching the device by `link` (a `tcp`
/// or `rtu` line) with the whole map.
fn source(name: &str, link: &str, device: &str) -> String {
    let mut text = format!(
        "\n[[sources.modbus]]\nname = \"{name}\"\n{link}\npoll_interval = \"100ms\"\n\
         timeout = \"500ms\"\nbackoff_initial = \"50ms\"\nbackoff_max = \"200ms\"\n\
         device = {{ type = \"plc\", id = \"{device}\" }}\n"
    );
    for (reg, table, address, ty, order, _) in ENTRIES {
        let extra = match *reg {
            "temperature" => "unit = \"°C\"\n",
            "raw_speed" => "scale = 0.5\noffset = 1.0\nunit = \"rpm\"\n",
            "label" => "length = 4\n",
            _ => "",
        };
        text.push_str(&format!(
            "[[sources.modbus.registers]]\nname = \"{reg}\"\ntable = \"{table}\"\n\
             address = {address}\ntype = \"{ty}\"\norder = \"{order}\"\n{extra}"
        ));
    }
    text
}

/// What every reading of the map holds.
fn expected() -> Value {
    json!({
        "temperature": 21.5,
        "cycles": 305_419_896,
        "offset_c": -40,
        "energy_wh": 1_234_567_890_123_u64,
        "pressure": 3.25,
        "drift": -123_456_789_012_i64,
        "label": "PRESS-4",
        "raw_speed": 618.0,
        "alarm": false,
        "running": true,
        "units": {"temperature": "°C", "raw_speed": "rpm"},
    })
}

async fn readings(cloud: &CloudProc, device: &str) -> Vec<Value> {
    let events = cloud.events("sensor.reading").await;
    events.into_iter().filter(|e| e["object"]["id"] == device).collect()
}

#[tokio::test]
async fn modbus_tcp_values_arrive_decoded_and_faulty_devices_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let map = tmp.path().join("map.toml");
    write_map(&map);
    let map = map.display().to_string();
    let good_args = ["modbus", "--listen", "127.0.0.1:0", "--map", &map];
    let good = Process::start("opgraph-sim", &good_args, &[], &["modbus"]).await.unwrap();
    let flaky_args = [&good_args[..], &["--exception-every", "2"]].concat();
    let flaky = Process::start("opgraph-sim", &flaky_args, &[], &["modbus"]).await.unwrap();
    // A port nobody listens on: bound, then released.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();

    let sources = [
        source("press", &format!("tcp = \"{}\"", good.addrs["modbus"]), "press-4"),
        source("flaky", &format!("tcp = \"{}\"", flaky.addrs["modbus"]), "press-5"),
        source("gone", &format!("tcp = \"{dead}\""), "press-6"),
    ]
    .concat();
    let (cloud, config) = grpc_site(tmp.path(), &sources).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;

    let events = eventually("three readings of the good device", DELIVERY_TIMEOUT, || async {
        let events = readings(&cloud, "press-4").await;
        (events.len() >= 3).then_some(events)
    })
    .await;
    let expected = expected();
    for event in &events {
        assert_eq!(event["properties"], expected, "{event}");
        assert_eq!(event["object"], json!({"type": "plc", "id": "press-4"}));
        assert_eq!(event["context"]["source"], "press");
    }

    // The faulty devices are counted, not silent, and did not stall it.
    let health = eventually("faults counted", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        let by_name = |name: &str| {
            health["sources"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned()
        };
        let (flaky, gone) = (by_name("flaky")?, by_name("gone")?);
        let exceptions = flaky["rejected"]["exception"].as_u64().unwrap_or(0);
        let refused = gone["rejected"]["io"].as_u64().unwrap_or(0);
        (exceptions >= 2 && refused >= 2).then_some(health)
    })
    .await;
    let sources = health["sources"].as_array().unwrap();
    let press = sources.iter().find(|s| s["name"] == "press").unwrap();
    assert_eq!(press["connected"], true, "{health}");
    assert_eq!(press["kind"], "modbus");
    assert_eq!(press["rejected_total"], 0, "{health}");
    let gone = sources.iter().find(|s| s["name"] == "gone").unwrap();
    assert_eq!(gone["connected"], false, "{health}");
    assert!(gone["last_error"].as_str().unwrap().contains(&dead.to_string()), "{health}");
    assert_eq!(health["status"], "degraded", "a source is down: {health}");

    // The flaky device's good answers still become readings; the values
    // behind an exception are missing from that poll, never wrong.
    let flaky_events = eventually("a reading of the flaky device", DELIVERY_TIMEOUT, || async {
        let events = readings(&cloud, "press-5").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    for event in flaky_events {
        let properties = event["properties"].as_object().unwrap();
        for (key, value) in properties.iter().filter(|(k, _)| *k != "units") {
            assert_eq!(&expected[key], value, "{key} of {event}");
        }
        for (key, unit) in properties["units"].as_object().into_iter().flatten() {
            assert_eq!(&expected["units"][key], unit, "unit of {key} in {event}");
        }
    }
    let metrics = gateway.metrics().await;
    assert!(metrics.contains("source=\"flaky\""), "{metrics}");

    assert!(gateway.process.terminate().await.unwrap().success());
    let summary = good.terminate().await.unwrap();
    assert!(summary.success());
}

/// The same register map over Modbus RTU on a pseudo-terminal.
#[tokio::test]
async fn modbus_rtu_values_arrive_decoded() {
    let tmp = tempfile::tempdir().unwrap();
    let map = tmp.path().join("map.toml");
    write_map(&map);
    let link = tmp.path().join("rs485");
    let args =
        ["modbus", "--rtu-link", &link.display().to_string(), "--map", &map.display().to_string()];
    let device = Process::start("opgraph-sim", &args, &[], &["modbus"]).await.unwrap();

    let rtu = format!(
        "rtu = {{ path = {:?}, baud = 19200, parity = \"even\" }}",
        link.display().to_string()
    );
    let source = source("line-2", &rtu, "press-7");
    let (cloud, config) = grpc_site(tmp.path(), &source).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;

    let events = eventually("two readings over RTU", DELIVERY_TIMEOUT, || async {
        let events = readings(&cloud, "press-7").await;
        (events.len() >= 2).then_some(events)
    })
    .await;
    for event in &events {
        assert_eq!(event["properties"], expected(), "{event}");
    }
    let health = gateway.health().await;
    assert_eq!(health["sources"][0]["rejected_total"], 0, "{health}");
    assert!(gateway.process.terminate().await.unwrap().success());
    assert!(device.terminate().await.unwrap().success());
}

/// Misbehaving devices: one on an RTU line that sends every tenth answer
/// with a wrong CRC, one over TCP that hangs up instead of answering every
/// tenth request. Each is counted per device in health (`crc`, `io`), and
/// the answers in between still become exact readings.
#[tokio::test]
async fn modbus_crc_errors_and_disconnects_are_counted_per_device() {
    let tmp = tempfile::tempdir().unwrap();
    let map = tmp.path().join("map.toml");
    write_map(&map);
    let map = map.display().to_string();
    let link = tmp.path().join("rs485").display().to_string();
    let garbling = ["modbus", "--rtu-link", &link, "--map", &map, "--crc-error-every", "10"];
    let garbling = Process::start("opgraph-sim", &garbling, &[], &["modbus"]).await.unwrap();
    let hanging = ["modbus", "--listen", "127.0.0.1:0", "--map", &map, "--disconnect-every", "10"];
    let hanging = Process::start("opgraph-sim", &hanging, &[], &["modbus"]).await.unwrap();

    let sources = [
        source("line-3", &format!("rtu = {{ path = {link:?}, baud = 19200 }}"), "press-8"),
        source("hangup", &format!("tcp = \"{}\"", hanging.addrs["modbus"]), "press-9"),
    ]
    .concat();
    let (cloud, config) = grpc_site(tmp.path(), &sources).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;

    let health = eventually("CRC errors and disconnects counted", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        let by_name = |name: &str| {
            health["sources"].as_array().unwrap().iter().find(|s| s["name"] == name).cloned()
        };
        let (line, hangup) = (by_name("line-3")?, by_name("hangup")?);
        let crc = line["rejected"]["crc"].as_u64().unwrap_or(0);
        let cut = hangup["rejected"]["io"].as_u64().unwrap_or(0);
        (crc >= 2 && cut >= 2).then_some(health)
    })
    .await;
    let sources = health["sources"].as_array().unwrap();
    let line = sources.iter().find(|s| s["name"] == "line-3").unwrap();
    // A wrong CRC is counted as such, not as the timeout it causes.
    assert!(line["rejected"].get("timeout").is_none(), "{health}");
    assert!(line["last_error"].as_str().unwrap().contains("CRC"), "{health}");
    let hangup = sources.iter().find(|s| s["name"] == "hangup").unwrap();
    assert!(hangup["rejected"].get("crc").is_none(), "{health}");

    for device in ["press-8", "press-9"] {
        let events = eventually("readings between the faults", DELIVERY_TIMEOUT, || async {
            let events = readings(&cloud, device).await;
            (events.len() >= 2).then_some(events)
        })
        .await;
        for event in &events {
            assert_eq!(event["properties"], expected(), "{event}");
        }
    }
    assert!(gateway.process.terminate().await.unwrap().success());
    assert!(garbling.terminate().await.unwrap().success());
    assert!(hanging.terminate().await.unwrap().success());
}
