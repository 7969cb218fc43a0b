//! Starting and stopping the cloud: open the store, bootstrap, bind, serve,
//! and on shutdown drain requests, flush usage, close the store.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::auth::{self, Authenticator, Scope, jwt::JwtVerifier};
use crate::config::{Config, StoreKind};
use crate::receiver::tls::TlsMaterial;
use crate::receiver::{Receiver, grpc, quic};
use crate::store::clickhouse::{ClickHouseConfig, ClickHouseStore};
use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::store::{ApiKeyRecord, NewApiKey, Store, Workspace};
use crate::telemetry::Metrics;
use crate::usage::Usage;
use crate::webhooks::Webhooks;

pub const DEFAULT_WORKSPACE: &str = "ws_default";
const BOOTSTRAP_KEY_FILE: &str = "bootstrap-key";
/// How long receivers may take to finish in-flight batches on shutdown.
const RECEIVER_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the cloud until `shutdown` is cancelled; prints one
/// `listening http=ADDR` line on stdout once it accepts connections.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut state = build_state(config).await?;
    let store = Arc::clone(&state.store);

    let listener = TcpListener::bind(state.config.http.addr)
        .await
        .map_err(|e| anyhow::anyhow!("http.addr {}: {e}", state.config.http.addr))?;
    let addr = listener.local_addr()?;
    api::trackables::default_public_url(&mut state, addr);
    announce(&format!("listening http={addr}"));
    let receivers = start_receivers(&state, shutdown.clone()).await?;
    let key = match state.config.auth.bootstrap_key {
        Some(_) => "$OPGRAPH_BOOTSTRAP_KEY".to_owned(),
        None => {
            format!("$(cat {})", state.config.store.data_dir.join(BOOTSTRAP_KEY_FILE).display())
        }
    };
    announce(&format!(
        "try: curl -s -X POST http://{addr}/api/ingest -H \"Authorization: Bearer {key}\" \\\n\
         \x20       -H 'Content-Type: application/json' -d '{{\"event\": \"pallet.scanned\"}}'\n\
         then: curl -s http://{addr}/api/events -H \"Authorization: Bearer {key}\""
    ));

    let flusher = tokio::spawn(flush_usage(state.clone(), shutdown.clone()));
    let watcher = tokio::spawn(Arc::clone(&state.webhooks).watch_anomalies(shutdown.clone()));
    let pruner = tokio::spawn(Arc::clone(&state.webhooks).prune_log(shutdown.clone()));
    let resumer = tokio::spawn(Arc::clone(&state.webhooks).resume(shutdown.clone()));
    let app = api::routes().into_router(state.clone());
    // Handlers find the peer's address: the scan redirect hashes it
    // (api::scan).
    let limits = state.config.http.limits();
    opgraph_proto::serve::serve(listener, app, limits, shutdown.clone().cancelled_owned()).await;

    shutdown.cancel();
    for mut task in receivers {
        // Receivers finish their current batch; a peer that keeps a
        // connection open past this does not hold the shutdown up.
        if tokio::time::timeout(RECEIVER_DRAIN, &mut task).await.is_err() {
            tracing::warn!("a receiver did not stop in time; closing it");
            task.abort();
        }
    }
    let _ = flusher.await;
    watcher.abort();
    pruner.abort();
    resumer.abort();
    let pending = state.webhooks.outstanding();
    if pending > 0 {
        state.webhooks.release().await;
        tracing::info!(pending, "webhook deliveries pending; the next start carries on with them");
    }
    state.usage.flush(state.store.as_ref()).await;
    store.close().await?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Starts the gRPC and QUIC gateway receivers that are configured, each
/// announcing its bound address.
async fn start_receivers(
    state: &AppState,
    shutdown: CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let config = &state.config.receivers;
    if config.grpc_addr.is_none() && config.quic_addr.is_none() {
        return Ok(Vec::new());
    }
    let tls = TlsMaterial::load(config, &state.config.store.data_dir)?;
    let receiver = Arc::new(Receiver::new(
        Arc::clone(&state.store),
        Arc::clone(&state.auth),
        Arc::clone(&state.metrics),
        Arc::clone(&state.usage),
    ));
    let mut tasks = Vec::new();
    if let Some(addr) = config.grpc_addr {
        let (bound, task) =
            grpc::start(addr, Arc::clone(&receiver), &tls, shutdown.clone()).await?;
        announce(&format!("listening grpc={bound}"));
        tasks.push(task);
    }
    if let Some(addr) = config.quic_addr {
        let unauthenticated = config.quic_max_unauthenticated_connections;
        let (bound, task) =
            quic::start(addr, Arc::clone(&receiver), &tls, unauthenticated, shutdown.clone())?;
        announce(&format!("listening quic={bound}"));
        tasks.push(task);
    }
    Ok(tasks)
}

/// Opens the configured store, bootstraps it and builds what every handler
/// reaches: all of start-up but binding. The ingest benchmark serves the
/// router of exactly this state.
pub async fn build_state(config: Config) -> anyhow::Result<AppState> {
    let store: Arc<dyn Store> = match config.store.kind {
        StoreKind::Embedded => Arc::new(EmbeddedStore::open(
            &config.store.data_dir,
            EmbeddedOptions {
                group_commit_window: config.store.group_commit_window,
                writer_cache: config.store.writer_cache.as_u64(),
                ..EmbeddedOptions::default()
            },
        )?),
        StoreKind::Clickhouse => {
            // Still the home of the bootstrap key, TLS material and salts.
            std::fs::create_dir_all(&config.store.data_dir).map_err(|e| {
                anyhow::anyhow!("store.data_dir {}: {e}", config.store.data_dir.display())
            })?;
            let url = config.store.clickhouse_url.clone().unwrap_or_default();
            let database = config.store.clickhouse_database.clone();
            let cluster = config.store.clickhouse_cluster.clone();
            let ca_file = config.store.clickhouse_ca_file.clone();
            let store = ClickHouseConfig { url, database, cluster, ca_file };
            Arc::new(ClickHouseStore::open(&store).await?)
        }
    };
    bootstrap(&config, store.as_ref()).await?;
    let jwt = JwtVerifier::from_config(&config.auth.jwt)?;
    let scans = Arc::new(api::scan::ScanGuard::from_config(&config)?);
    let (config, metrics) = (Arc::new(config), Arc::new(Metrics::new()));
    Ok(AppState {
        usage: Arc::new(Usage::new(config.rate_limit.clone(), config.usage.clone())),
        auth: Arc::new(Authenticator::new(jwt)),
        webhooks: Webhooks::new(Arc::clone(&store), Arc::clone(&config), Arc::clone(&metrics)),
        metrics,
        scans,
        store,
        config,
    })
}

/// One line on stdout, flushed at once: test harnesses wait for it.
fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn flush_usage(state: AppState, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => state.usage.flush(state.store.as_ref()).await,
        }
    }
}

/// On an empty store: workspace `ws_default` with business `default`, and an
/// operator key, printed once and saved (mode 0600) in the data directory.
/// With a configured bootstrap key, that key is (re)registered instead, so a
/// deployment can know its key in advance.
/// Keys of the default workspace looked through for earlier bootstrap
/// keys at start.
const MAX_KEYS_SCANNED: usize = 100_000;

async fn bootstrap(config: &Config, store: &dyn Store) -> anyhow::Result<()> {
    let fresh = store.count_workspaces().await? == 0;
    if fresh {
        store
            .create_workspace(&Workspace {
                id: DEFAULT_WORKSPACE.into(),
                name: "Default workspace".into(),
                created_at: crate::now_ms(),
            })
            .await?;
    }
    let key = match (&config.auth.bootstrap_key, fresh) {
        (Some(key), _) => key.clone(),
        (None, true) => auth::generate_api_key(),
        (None, false) => return Ok(()),
    };
    let mut scopes = Scope::DEFAULT.to_vec();
    scopes.push(Scope::Operator);
    let record = ApiKeyRecord {
        id: crate::ids::new_id("key"),
        workspace_id: DEFAULT_WORKSPACE.into(),
        name: "bootstrap operator key".into(),
        hint: auth::key_hint(&key),
        scopes,
        created_at: crate::now_ms(),
        revoked_at: None,
    };
    let current = store.insert_api_key(NewApiKey { record, hash: auth::hash_key(&key) }).await?;
    // Only the bootstrap key holds `operator`: a key configured anew (a
    // rotation, after a leak say) replaces the one before, which must stop
    // working rather than live on beside it.
    for old in store.list_api_keys(DEFAULT_WORKSPACE, MAX_KEYS_SCANNED).await? {
        let operator = old.scopes.contains(&Scope::Operator);
        if operator && old.id != current.id && old.revoked_at.is_none() {
            store.revoke_api_key(DEFAULT_WORKSPACE, &old.id).await?;
            tracing::warn!(key = %old.hint, "an earlier bootstrap operator key is revoked: another one is configured");
        }
    }
    if config.auth.bootstrap_key.is_none() {
        let path = config.store.data_dir.join(BOOTSTRAP_KEY_FILE);
        write_secret(&path, &key)?;
        announce(&format!("bootstrap api key: {key} (saved to {})", path.display()));
    }
    Ok(())
}

pub(crate) fn write_secret(path: &std::path::Path, secret: &str) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    writeln!(file, "{secret}")?;
    file.sync_all()?;
    Ok(())
}
