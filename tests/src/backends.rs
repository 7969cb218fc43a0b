//! One scenario, both stores: starts a [`Cloud`] on the embedded store or
//! on a private ClickHouse server, so that an end-to-end suite runs each
//! case against both backends.
//!
//! ```ignore
//! use opgraph_tests::backends::Backend;
//!
//! async fn lists_what_was_created(backend: Backend) {
//!     let cloud = backend.start(&[]).await.unwrap();
//!     // `cloud` derefs to `Cloud`: `cloud.at(..)`, `cloud.key`, `&cloud` as `&Cloud`.
//! }
//!
//! // Two tests: `lists_what_was_created::embedded` and `::clickhouse`.
//! opgraph_tests::both_backends!(lists_what_was_created);
//! ```
//!
//! Each [`BackendCloud`] owns its data directory and, on ClickHouse, its
//! own server, so tests stay independent when cargo runs them side by side.
//! To change the store behind the cloud's back (tampering), stop it,
//! change it, start it again:
//!
//! ```ignore
//! let stopped = cloud.stop().await.unwrap();
//! match stopped.backend {
//!     Backend::Embedded => { /* rusqlite on stopped.data_dir().join("opgraph.db") */ }
//!     Backend::ClickHouse => { stopped.clickhouse_mutate("ALTER TABLE t UPDATE ...").await.unwrap(); }
//! }
//! let cloud = stopped.start().await.unwrap();
//! ```

use std::ops::Deref;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::Cloud;
use crate::clickhouse::ClickHouse;

/// The database the cloud uses on the private server.
pub const CLICKHOUSE_DATABASE: &str = "opgraph_e2e";

/// How long a mutation may take to apply (milliseconds on a test table).
const MUTATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Which store the cloud runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// SQLite in the data directory (the default).
    Embedded,
    /// `OPGRAPH_STORE=clickhouse` on a fresh private `clickhouse-server`.
    ClickHouse,
}

/// A running cloud and the store behind it. Derefs to [`Cloud`].
///
/// Field order matters: the cloud is dropped (killed) before the ClickHouse
/// server it writes to and the data directory.
pub struct BackendCloud {
    pub cloud: Cloud,
    store: BackendStore,
}

/// The store behind a cloud (data directory, ClickHouse server) and the
/// cloud's environment: what is left of a stopped cloud, ready to start it
/// again.
pub struct BackendStore {
    pub backend: Backend,
    clickhouse: Option<ClickHouse>,
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
}

impl Backend {
    /// Starts a fresh cloud with the test bootstrap key and `extra_env` on
    /// this backend (for ClickHouse, a new empty server first). Fails, never
    /// skips, when `clickhouse-server` is not installed.
    pub async fn start(self, extra_env: &[(&str, String)]) -> Result<BackendCloud> {
        let clickhouse = match self {
            Backend::Embedded => None,
            Backend::ClickHouse => {
                Some(ClickHouse::start().await.context("a private ClickHouse server")?)
            }
        };
        let mut env: Vec<(String, String)> = Vec::new();
        if let Some(server) = &clickhouse {
            env.push(("OPGRAPH_STORE".into(), "clickhouse".into()));
            env.push(("OPGRAPH_CLICKHOUSE_URL".into(), server.url()));
            env.push(("OPGRAPH_CLICKHOUSE_DATABASE".into(), CLICKHOUSE_DATABASE.into()));
        }
        env.extend(extra_env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        BackendStore { backend: self, clickhouse, env, dir: tempfile::tempdir()? }.start().await
    }
}

impl BackendStore {
    /// Starts the cloud on this store with the environment it had.
    pub async fn start(self) -> Result<BackendCloud> {
        let env: Vec<(&str, String)> =
            self.env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let cloud = Cloud::start_in(self.dir.path(), &env).await?;
        Ok(BackendCloud { cloud, store: self })
    }

    /// Starts another cloud on the same ClickHouse database, beside the
    /// one already running (the embedded store's directory belongs to one
    /// process), with the same environment and `extra_env`.
    pub async fn start_beside(&self, extra_env: &[(&str, String)]) -> Result<Cloud> {
        anyhow::ensure!(self.clickhouse.is_some(), "only clouds on ClickHouse share a store");
        let mut env: Vec<(&str, String)> =
            self.env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        env.extend(extra_env.iter().cloned());
        Cloud::start(&env).await
    }

    /// The cloud's data directory (the embedded store's `opgraph.db`).
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The ClickHouse server, when on [`Backend::ClickHouse`].
    pub fn clickhouse(&self) -> Option<&ClickHouse> {
        self.clickhouse.as_ref()
    }

    /// Runs one SQL statement in the cloud's ClickHouse database over the
    /// HTTP interface, as an operator with direct access would (e.g. to
    /// tamper with a row), and returns the answer as text. Errors on the
    /// embedded backend and when ClickHouse refuses the statement.
    pub async fn clickhouse_sql(&self, sql: &str) -> Result<String> {
        let server = self.clickhouse.as_ref().context("not on the ClickHouse backend")?;
        let response = reqwest::Client::new()
            // The database name is a plain identifier: nothing to escape.
            .post(format!("{}/?database={CLICKHOUSE_DATABASE}", server.url()))
            .body(sql.to_owned())
            .send()
            .await?;
        let status = response.status();
        let text = response.text().await?;
        anyhow::ensure!(status.is_success(), "ClickHouse answered {status} to {sql}: {text}");
        Ok(text)
    }

    /// Runs a mutation (`ALTER TABLE ... UPDATE/DELETE ...`) in the cloud's
    /// ClickHouse database and returns once it has been applied.
    pub async fn clickhouse_mutate(&self, sql: &str) -> Result<()> {
        self.clickhouse_sql(sql).await?;
        // 18.16 has no `mutations_sync`: mutations run in the background
        // and only `system.mutations` tells when they are done.
        let pending = format!(
            "SELECT count() FROM system.mutations WHERE database = '{CLICKHOUSE_DATABASE}' \
             AND is_done = 0"
        );
        let deadline = Instant::now() + MUTATION_TIMEOUT;
        while self.clickhouse_sql(&pending).await?.trim() != "0" {
            anyhow::ensure!(Instant::now() < deadline, "{sql} not applied in {MUTATION_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

impl BackendCloud {
    /// Which store this cloud runs on.
    pub fn backend(&self) -> Backend {
        self.store.backend
    }

    /// Stops the cloud with SIGTERM (failing unless it exits cleanly),
    /// keeping its store.
    pub async fn stop(self) -> Result<BackendStore> {
        let BackendCloud { cloud, store } = self;
        let status = cloud.process.terminate().await?;
        anyhow::ensure!(status.success(), "the cloud exited with {status}");
        Ok(store)
    }

    /// Kills the cloud with SIGKILL (no chance to finish anything),
    /// keeping its store.
    pub async fn kill(self) -> Result<BackendStore> {
        let BackendCloud { cloud, store } = self;
        cloud.process.kill9().await?;
        Ok(store)
    }

    /// [`Self::stop`], then [`BackendStore::start`].
    pub async fn restart(self) -> Result<BackendCloud> {
        self.stop().await?.start().await
    }

    /// The store, to read or change it directly while the cloud runs.
    pub fn store(&self) -> &BackendStore {
        &self.store
    }
}

impl Deref for BackendCloud {
    type Target = Cloud;
    fn deref(&self) -> &Cloud {
        &self.cloud
    }
}

/// `both_backends!(a, b);` defines, for each case, a module `a` holding two
/// `#[tokio::test]`s, `a::embedded` and `a::clickhouse`, that call
/// `async fn a(backend: Backend)` of the same file. Filter with
/// `cargo test ... clickhouse` to run one backend.
#[macro_export]
macro_rules! both_backends {
    ($($case:ident),+ $(,)?) => {
        $(
            mod $case {
                #[tokio::test]
                async fn embedded() {
                    super::$case($crate::backends::Backend::Embedded).await
                }
                #[tokio::test]
                async fn clickhouse() {
                    super::$case($crate::backends::Backend::ClickHouse).await
                }
            }
        )+
    };
}
