//! [`GatewayStore`] on ClickHouse: the session row is written after the
//! batch's events, under the workspace's lock. A crash between the two
//! leaves the ack behind the data; the redelivered batch then finds its
//! event ids stored and adds nothing (see [`super::events::stored_ids`]).

use async_trait::async_trait;
use clickhouse::Row;
use serde::{Deserialize, Serialize};

use super::{ClickHouseStore, Sent, events, run};
use crate::error::Result;
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

#[derive(Row, Deserialize)]
struct SessionRead {
    epoch: u64,
    acked_sequence: u64,
    buffer_id: String,
}

impl ClickHouseStore {
    async fn load_session(&self, ws: &str, gateway: &str) -> Result<Option<SessionRead>> {
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
        Ok(rows.into_iter().next())
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
        self.insert_rows::<SessionRow<'_>>("gateway_sessions", &[row]).await
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
            events::store_rows(self, workspace_id, fresh).await?.1
        };
        let next = GatewaySession { epoch, acked_sequence: last };
        self.save_session(workspace_id, gateway_id, next, &session.buffer_id).await?;
        Ok(BatchCommit::Acked { acked_sequence: last, inserted })
    }
}
