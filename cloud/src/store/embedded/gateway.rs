//! [`GatewayStore`] on SQLite: sessions and batch commits in the writer's
//! transaction.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::{EmbeddedStore, events, sql};
use crate::error::{Error, Result};
use crate::store::NewEvent;
use crate::store::gateway::{BatchCommit, GatewaySession, GatewayStore};

fn load(conn: &Connection, ws: &str, gateway: &str) -> Result<Option<GatewaySession>> {
    conn.query_row(
        "SELECT epoch, acked_sequence FROM gateway_sessions
         WHERE workspace_id = ?1 AND gateway_id = ?2",
        params![ws, gateway],
        |r| {
            Ok(GatewaySession {
                epoch: r.get::<_, i64>(0)?.max(0) as u64,
                acked_sequence: r.get::<_, i64>(1)?.max(0) as u64,
            })
        },
    )
    .optional()
    .map_err(sql)
}

fn to_sql(n: u64) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::validation("sequence", "sequence out of range"))
}

#[async_trait]
impl GatewayStore for EmbeddedStore {
    async fn open_gateway_session(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        buffer_id: &str,
    ) -> Result<GatewaySession> {
        let (ws, gateway, buffer) =
            (workspace_id.to_owned(), gateway_id.to_owned(), buffer_id.to_owned());
        self.write(move |conn| {
            let stored: Option<String> = conn
                .query_row(
                    "SELECT buffer_id FROM gateway_sessions
                     WHERE workspace_id = ?1 AND gateway_id = ?2",
                    params![ws, gateway],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql)?;
            let current = load(conn, &ws, &gateway)?.unwrap_or_default();
            let recreated = matches!(
                &stored,
                Some(old) if !old.is_empty() && !buffer.is_empty() && *old != buffer
            );
            if recreated {
                tracing::warn!(
                    workspace = %ws, gateway = %gateway, previous_ack = current.acked_sequence,
                    "gateway presents a new buffer: its sequences restart at 1"
                );
            }
            let next = GatewaySession {
                epoch: current.epoch + 1,
                acked_sequence: if recreated { 0 } else { current.acked_sequence },
            };
            let keep_buffer = if buffer.is_empty() { stored.unwrap_or_default() } else { buffer };
            conn.execute(
                "INSERT INTO gateway_sessions
                    (workspace_id, gateway_id, epoch, acked_sequence, buffer_id, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT DO UPDATE SET epoch = excluded.epoch,
                    acked_sequence = excluded.acked_sequence, buffer_id = excluded.buffer_id,
                    updated_at = excluded.updated_at",
                params![
                    ws,
                    gateway,
                    to_sql(next.epoch)?,
                    to_sql(next.acked_sequence)?,
                    keep_buffer,
                    crate::now_ms()
                ],
            )
            .map_err(sql)?;
            Ok(next)
        })
        .await
    }

    async fn commit_gateway_batch(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        epoch: u64,
        (first, last): (u64, u64),
        events: Vec<(u64, NewEvent)>,
        new_event_limit: Option<u64>,
    ) -> Result<BatchCommit> {
        let (ws, gateway) = (workspace_id.to_owned(), gateway_id.to_owned());
        // Rows are prepared outside the writer thread; which of them are
        // new is decided inside, against the ack of that moment.
        let sequences: Vec<u64> = events.iter().map(|(seq, _)| *seq).collect();
        let rows = events::prepare_rows(events.into_iter().map(|(_, e)| e).collect());
        let hints = self.search.hints();
        self.write(move |conn| {
            let session = load(conn, &ws, &gateway)?.unwrap_or_default();
            let acked = match BatchCommit::admit(
                session.epoch,
                session.acked_sequence,
                epoch,
                (first, last),
            ) {
                Ok(acked) => acked,
                Err(answer) => return Ok(answer),
            };
            let fresh: Vec<_> = sequences
                .iter()
                .zip(rows)
                .filter(|(seq, _)| **seq > acked)
                .map(|(_, row)| row)
                .collect();
            let inserted = if fresh.is_empty() {
                0
            } else {
                events::append(conn, &ws, fresh, None, Some(&hints))?.inserted
            };
            // An error rolls the job back: no event stays, the ack stays.
            if new_event_limit.is_some_and(|left| inserted as u64 > left) {
                return Err(crate::usage::quota_exceeded());
            }
            conn.execute(
                "UPDATE gateway_sessions SET acked_sequence = ?3, updated_at = ?4
                 WHERE workspace_id = ?1 AND gateway_id = ?2",
                params![ws, gateway, to_sql(last)?, crate::now_ms()],
            )
            .map_err(sql)?;
            Ok(BatchCommit::Acked { acked_sequence: last, inserted })
        })
        .await
    }
}
