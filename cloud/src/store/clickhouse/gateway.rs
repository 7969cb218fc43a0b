//! [`GatewayStore`] on ClickHouse: the session row is written after the
//! batch's events, under the workspace's lock. A crash between the two
//! leaves the ack behind the data; the redelivered batch then finds its
//! event ids stored and adds nothing (see [`super::events::stored_ids`]).
//!
//! Sessions are kept in memory once read or written: the workspace's lock
//! is this process's already, so no other writer can move them (one cloud
//! process per workspace, see `docs/storage.md`), and a batch then costs
//! no query for its session.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use clickhouse::Row;
use serde::{Deserialize, Serialize};

use super::{ClickHouseStore, Sent, events, run};
use crate::error::{Error, Result};
use crate::store::NewEvent;
use crate::store::gateway::{BatchCommit, GatewaySession, GatewayStore};

#[derive(Row, Serialize)]
struct SessionRow<'a> {
    workspace_id: &'a str,
    gateway_id: &'a str,
    epoch: u64,
    acked_sequence: u64,
    buffer_id: &'a str,
    updated_at: i64,
    version: u64,
}

#[derive(Row, Deserialize, Clone)]
struct SessionRead {
    epoch: u64,
    acked_sequence: u64,
    buffer_id: String,
}

/// Sessions as this process last read or wrote them, by workspace and
/// gateway.
#[derive(Default)]
pub(super) struct KnownSessions(Mutex<HashMap<(String, String), SessionRead>>);

impl KnownSessions {
    fn map(&self) -> Result<std::sync::MutexGuard<'_, HashMap<(String, String), SessionRead>>> {
        self.0.lock().map_err(|_| Error::internal("gateway sessions poisoned"))
    }

    fn get(&self, ws: &str, gateway: &str) -> Result<Option<SessionRead>> {
        Ok(self.map()?.get(&(ws.to_owned(), gateway.to_owned())).cloned())
    }

    /// `None` forgets the session: its next use reads it back.
    fn set(&self, ws: &str, gateway: &str, session: Option<SessionRead>) -> Result<()> {
        let key = (ws.to_owned(), gateway.to_owned());
        let mut map = self.map()?;
        match session {
            Some(session) => map.insert(key, session),
            None => map.remove(&key),
        };
        Ok(())
    }
}

impl ClickHouseStore {
    async fn load_session(&self, ws: &str, gateway: &str) -> Result<Option<SessionRead>> {
        if let Some(known) = self.sessions.get(ws, gateway)? {
            return Ok(Some(known));
        }
        let rows: Vec<SessionRead> = run(self
            .client
            .query(
                "SELECT argMax(epoch, version), argMax(acked_sequence, version),
                    argMax(buffer_id, version)
                 FROM gateway_sessions WHERE workspace_id = ? AND gateway_id = ?
                 GROUP BY workspace_id, gateway_id",
            )
            .bind(ws)
            .bind(gateway)
            .sent()
            .fetch_all())
        .await?;
        let stored = rows.into_iter().next();
        if stored.is_some() {
            self.sessions.set(ws, gateway, stored.clone())?;
        }
        Ok(stored)
    }

    async fn save_session(
        &self,
        ws: &str,
        gateway: &str,
        session: GatewaySession,
        buffer_id: &str,
    ) -> Result<()> {
        let row = SessionRow {
            workspace_id: ws,
            gateway_id: gateway,
            epoch: session.epoch,
            acked_sequence: session.acked_sequence,
            buffer_id,
            updated_at: crate::now_ms(),
            version: self.clock.next(),
        };
        let saved = self.insert_rows::<SessionRow<'_>>("gateway_sessions", &[row]).await;
        // A failed insert may still have landed: read it back next time.
        let known = saved.is_ok().then(|| SessionRead {
            epoch: session.epoch,
            acked_sequence: session.acked_sequence,
            buffer_id: buffer_id.to_owned(),
        });
        self.sessions.set(ws, gateway, known)?;
        saved
    }
}

#[async_trait]
impl GatewayStore for ClickHouseStore {
    async fn open_gateway_session(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        buffer_id: &str,
    ) -> Result<GatewaySession> {
        let lock = self.lock_for(workspace_id)?;
        let _guard = lock.lock().await;
        let stored = self.load_session(workspace_id, gateway_id).await?;
        let (current, stored_buffer) = match stored {
            Some(s) => (
                GatewaySession { epoch: s.epoch, acked_sequence: s.acked_sequence },
                Some(s.buffer_id),
            ),
            None => (GatewaySession::default(), None),
        };
        let recreated = matches!(
            &stored_buffer,
            Some(old) if !old.is_empty() && !buffer_id.is_empty() && old != buffer_id
        );
        if recreated {
            tracing::warn!(
                workspace = %workspace_id, gateway = %gateway_id,
                previous_ack = current.acked_sequence,
                "gateway presents a new buffer: its sequences restart at 1"
            );
        }
        let next = GatewaySession {
            epoch: current.epoch + 1,
            acked_sequence: if recreated { 0 } else { current.acked_sequence },
        };
        let keep_buffer =
            if buffer_id.is_empty() { stored_buffer.unwrap_or_default() } else { buffer_id.into() };
        self.save_session(workspace_id, gateway_id, next, &keep_buffer).await?;
        Ok(next)
    }

    async fn commit_gateway_batch(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        epoch: u64,
        (first, last): (u64, u64),
        batch: Vec<(u64, NewEvent)>,
    ) -> Result<BatchCommit> {
        let lock = self.lock_for(workspace_id)?;
        let _guard = lock.lock().await;
        let session = self.load_session(workspace_id, gateway_id).await?.unwrap_or(SessionRead {
            epoch: 0,
            acked_sequence: 0,
            buffer_id: String::new(),
        });
        let acked =
            match BatchCommit::admit(session.epoch, session.acked_sequence, epoch, (first, last)) {
                Ok(acked) => acked,
                Err(answer) => return Ok(answer),
            };
        let fresh: Vec<_> = batch
            .into_iter()
            .filter(|(seq, _)| *seq > acked)
            .map(|(_, event)| events::to_row(workspace_id, event))
            .collect();
        let inserted = if fresh.is_empty() {
            0
        } else {
            events::store_rows_uncounted(self, workspace_id, fresh).await?.1
        };
        // Usage beside the acknowledgement: either failing returns an error
        // and the redelivered batch finds its events stored, which usage
        // never counts twice (nor, as before, at all).
        let next = GatewaySession { epoch, acked_sequence: last };
        tokio::try_join!(
            self.count_events_ingested(workspace_id, inserted),
            self.save_session(workspace_id, gateway_id, next, &session.buffer_id),
        )?;
        Ok(BatchCommit::Acked { acked_sequence: last, inserted })
    }
}
