//! The topic filters a persistent session holds at the broker, kept across
//! connections and runs.
//!
//! A broker keeps a session's subscriptions with the session. A filter
//! dropped from the configuration (a rule removed) would go on bringing its
//! messages on every resumed session, each rejected as `no_rule`, for as
//! long as the session lives: on Mosquitto over 3.1.1, for ever. So the
//! source remembers what it subscribed, in a file in the buffer directory
//! named for the broker and client id, and on a resumed session queues an
//! UNSUBSCRIBE of each filter it no longer wants before it subscribes again.
//! Those go out before any barrier of the connection can be queued (see
//! `redelivery.rs`: barriers are queued only once the connection is up, and
//! rumqttc writes requests in order), and their answers carry other packet
//! ids than a barrier's, so they never count as one.
//!
//! What the session held also tells the retained messages it brought
//! already from those of a filter new to it (see `Retained`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// The file's content.
#[derive(Debug, Serialize, Deserialize)]
struct Remembered {
    /// Broker and client id: the filters count only for that session.
    session: String,
    filters: Vec<String>,
}

/// The filters of one source's session.
pub struct Subscriptions {
    source: String,
    file: Option<Arc<File>>,
    session: String,
    /// What the broker may hold for the session; `None`: unknown (no file
    /// from an earlier run, or one of another session).
    held: Option<Vec<String>>,
    /// Of the filters wanted, those the session held before the current
    /// connection resumed it.
    resumed: Vec<String>,
    /// The latest write of the file.
    writing: Option<tokio::task::JoinHandle<()>>,
}

/// The file and the order of its writes, which run on blocking threads.
struct File {
    path: PathBuf,
    queued: AtomicU64,
    /// The generation last written.
    written: Mutex<u64>,
}

impl Subscriptions {
    /// Where a source keeps its session's filters: in `dir`, named after
    /// the source.
    pub fn path(dir: &Path, source: &str) -> PathBuf {
        super::redelivery::state_file(dir, "mqtt", source, "filters")
    }

    /// In `file` when given (read now, written from then on), for the
    /// session `session` (broker and client id).
    pub fn open(file: Option<PathBuf>, session: String, source: &str) -> Subscriptions {
        let held = file
            .as_deref()
            .and_then(|path| read(path, source))
            .and_then(|r| (r.session == session).then_some(r.filters));
        let file = file
            .map(|path| Arc::new(File { path, queued: AtomicU64::new(0), written: Mutex::new(0) }));
        Subscriptions {
            source: source.to_owned(),
            file,
            session,
            held,
            resumed: Vec::new(),
            writing: None,
        }
    }

    /// CONNACK, before subscribing to `wanted`: the filters to unsubscribe
    /// first.
    pub fn connected(&mut self, session_present: bool, wanted: &[String]) -> Vec<String> {
        if !session_present {
            // The broker holds nothing now; until the SUBACK, at most what
            // we ask for.
            self.resumed.clear();
            self.remember(Vec::new());
            return Vec::new();
        }
        match &self.held {
            None => {
                self.resumed = wanted.to_vec();
                Vec::new()
            }
            Some(held) => {
                self.resumed = wanted.iter().filter(|f| held.contains(f)).cloned().collect();
                held.iter().filter(|f| !wanted.contains(f)).cloned().collect()
            }
        }
    }

    /// SUBACK of `wanted`: the broker handled the UNSUBSCRIBEs queued
    /// before it too (it handles a connection's packets in order).
    pub fn subscribed(&mut self, wanted: &[String]) {
        if self.held.as_deref() != Some(wanted) {
            self.remember(wanted.to_vec());
        }
    }

    /// Whether `topic` matches a filter the resumed session held.
    pub fn resumed_match(&self, topic: &str) -> bool {
        self.resumed.iter().any(|filter| matches(filter, topic))
    }

    fn remember(&mut self, filters: Vec<String>) {
        if let Some(file) = &self.file {
            let remembered = Remembered { session: self.session.clone(), filters: filters.clone() };
            let generation = file.queued.fetch_add(1, Ordering::Relaxed) + 1;
            let (file, source) = (Arc::clone(file), self.source.clone());
            // fsync off the async threads; a write queued later wins.
            self.writing = Some(tokio::task::spawn_blocking(move || {
                file.write(generation, &remembered, &source);
            }));
        }
        self.held = Some(filters);
    }

    /// Once the latest write of the file is done.
    #[cfg(test)]
    pub async fn written(&mut self) {
        if let Some(writing) = self.writing.take() {
            let _ = writing.await;
        }
    }
}

impl File {
    fn write(&self, generation: u64, remembered: &Remembered, source: &str) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if *written > generation {
            return;
        }
        *written = generation;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let bytes = serde_json::to_vec(remembered).unwrap_or_default();
        if let Err(e) = crate::durable::replace(Path::new(&tmp), &self.path, &bytes) {
            tracing::warn!(%source, path = %self.path.display(), error = %e, "cannot keep the session's subscriptions: a filter removed from the configuration may go on bringing messages");
        }
    }
}

fn read(path: &Path, source: &str) -> Option<Remembered> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .inspect_err(|e| {
                tracing::warn!(%source, path = %path.display(), error = %e, "unreadable list of the session's subscriptions: ignored");
            })
            .ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(%source, path = %path.display(), error = %e, "cannot read the list of the session's subscriptions: ignored");
            None
        }
    }
}

/// Whether an MQTT topic filter matches a topic name (MQTT 3.1.1 4.7):
/// `+` one level, `#` the rest (and the parent level); wildcards first in
/// the filter do not match topics that start with `$`.
fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut levels = topic.split('/');
    for part in filter.split('/') {
        match (part, levels.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (part, Some(level)) if part == level => {}
            _ => return false,
        }
    }
    levels.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_as_mqtt_says() {
        for (filter, topic, expected) in [
            ("a/b", "a/b", true),
            ("a/b", "a/b/c", false),
            ("a/+", "a/b", true),
            ("a/+", "a/b/c", false),
            ("a/+/c", "a//c", true),
            ("a/#", "a", true),
            ("a/#", "a/b/c", true),
            ("#", "a/b", true),
            ("#", "$SYS/x", false),
            ("+/x", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
            ("é/+", "é/1", true),
            ("a", "b", false),
        ] {
            assert_eq!(matches(filter, topic), expected, "{filter} ~ {topic}");
        }
    }

    #[tokio::test]
    async fn a_resumed_session_drops_what_is_no_longer_wanted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.filters");
        let wanted = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let open =
            |session: &str| Subscriptions::open(Some(path.clone()), session.to_owned(), "test");

        let mut first = open("broker client");
        assert!(first.connected(true, &wanted(&["a/#", "b/+"])).is_empty(), "nothing known");
        assert!(first.resumed_match("b/1"), "unknown: all taken as held");
        first.subscribed(&wanted(&["a/#", "b/+"]));
        first.written().await;
        let file = std::fs::read_to_string(&path).unwrap();
        assert!(file.contains("broker client") && file.contains("b/+"), "{file}");

        let mut second = open("broker client");
        let stale = second.connected(true, &wanted(&["a/#", "c"]));
        assert_eq!(stale, wanted(&["b/+"]));
        assert!(second.resumed_match("a/x") && !second.resumed_match("c"));
        second.subscribed(&wanted(&["a/#", "c"]));
        second.written().await;

        // Another session's filters are not this one's.
        let mut other = open("broker other-client");
        assert!(other.connected(true, &wanted(&["z"])).is_empty());
        // A new session holds nothing: nothing to drop, nothing resumed.
        let mut fresh = open("broker client");
        assert!(fresh.connected(false, &wanted(&["z"])).is_empty());
        assert!(!fresh.resumed_match("a/x"));
    }
}
