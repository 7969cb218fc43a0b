//! The throttle's memory does not grow with what devices send. A test
//! binary of its own, so that the process's resident size is this test's.

#![allow(clippy::unwrap_used)] // tests fail loudly

use std::time::Duration;

use opgraph_gateway::source::mapping::throttle::{ThrottleConfig, ThrottleState};
use serde_json::{Value, json};

/// Resident set size (Linux; 4 KiB pages).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn what_the_throttle_remembers_does_not_grow_with_topics_and_payloads() {
    let config = ThrottleConfig {
        min_interval: Duration::from_secs(1),
        max_interval: None,
        deadband: [("x".to_owned(), 0.5)].into(),
    };
    // A device's message, mapped but not yet validated: 1 MiB of
    // properties under a 60 KB topic.
    let Value::Object(properties) = json!({"x": 1.0, "blob": "b".repeat(1 << 20)}) else {
        unreachable!()
    };
    let long = "t".repeat(60_000);
    let mut state = ThrottleState::default();
    let before = resident_bytes();
    for device in 0..400 {
        let topic = format!("devices/{device}/{long}");
        assert!(state.admit(&config, &topic, &properties, 0), "the first of each topic");
    }
    let grown = resident_bytes().saturating_sub(before);
    // Kept whole, that was 400 MiB of properties and 23 MiB of topics.
    assert!(grown < 32 << 20, "the throttle's memory grew by {} MiB", grown >> 20);
    assert!(!state.admit(&config, &format!("devices/0/{long}"), &properties, 500), "remembered");
}
