//! Webhooks in the embedded store: subscriptions with a deletion mark, and
//! an append-only log of delivery attempts. Both keep the JSON body the
//! API reads; the columns beside it serve the lookups.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::governance::limit_arg;
use super::{EmbeddedStore, sql};
use crate::error::Result;
use crate::store::governance::{from_json, to_json};
use crate::store::webhooks::{PendingDelivery, Webhook, WebhookAttempt, WebhookStore};

#[async_trait]
impl WebhookStore for EmbeddedStore {
    async fn insert_webhook(&self, ws: &str, webhook: &Webhook) -> Result<()> {
        let (ws, id, body) = (ws.to_owned(), webhook.id.clone(), to_json(webhook)?);
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO webhooks (workspace_id, id, body) VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut s| s.execute(params![ws, id, body]))
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn list_webhooks(&self, ws: &str, limit: usize) -> Result<Vec<Webhook>> {
        let ws = ws.to_owned();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT body FROM webhooks WHERE workspace_id = ?1 AND deleted_at IS NULL
                     ORDER BY id LIMIT ?2",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![ws, limit_arg(limit)], |r| r.get::<_, String>(0))
                .map_err(sql)?;
            rows.map(|row| from_json(&row.map_err(sql)?)).collect()
        })
        .await
    }

    async fn workspaces_with_webhooks(&self) -> Result<Vec<String>> {
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT DISTINCT workspace_id FROM webhooks WHERE deleted_at IS NULL
                     ORDER BY workspace_id",
                )
                .map_err(sql)?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(sql)?;
            rows.map(|row| row.map_err(sql)).collect()
        })
        .await
    }

    async fn delete_webhook(&self, ws: &str, id: &str, at_ms: i64) -> Result<bool> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        self.write(move |conn| {
            let changed = conn
                // The row stays, so that its log stays explained; its
                // secret has no use left and goes.
                .prepare_cached(
                    "UPDATE webhooks SET deleted_at = ?3, body = json_set(body, '$.secret', '')
                     WHERE workspace_id = ?1 AND id = ?2 AND deleted_at IS NULL",
                )
                .and_then(|mut s| s.execute(params![ws, id, at_ms]))
                .map_err(sql)?;
            Ok(changed > 0)
        })
        .await
    }

    async fn insert_webhook_attempt(&self, ws: &str, attempt: &WebhookAttempt) -> Result<()> {
        let (ws, a, body) = (ws.to_owned(), attempt.clone(), to_json(attempt)?);
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO webhook_attempts
                    (workspace_id, webhook_id, created_at, delivery_id, attempt, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| {
                s.execute(params![ws, a.webhook_id, a.created_at, a.delivery_id, a.attempt, body])
            })
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn save_pending_delivery(&self, ws: &str, pending: &PendingDelivery) -> Result<()> {
        let (ws, id, due, body) =
            (ws.to_owned(), pending.delivery_id.clone(), pending.due_at, to_json(pending)?);
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO webhook_pending (workspace_id, delivery_id, due_at, body)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| s.execute(params![ws, id, due, body]))
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn finish_pending_delivery(&self, ws: &str, delivery_id: &str) -> Result<()> {
        let (ws, id) = (ws.to_owned(), delivery_id.to_owned());
        self.write(move |conn| {
            conn.prepare_cached(
                "DELETE FROM webhook_pending WHERE workspace_id = ?1 AND delivery_id = ?2",
            )
            .and_then(|mut s| s.execute(params![ws, id]))
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn pending_delivery(
        &self,
        ws: &str,
        delivery_id: &str,
    ) -> Result<Option<PendingDelivery>> {
        let (ws, id) = (ws.to_owned(), delivery_id.to_owned());
        self.read(move |conn| {
            let body: Option<String> = conn
                .prepare_cached(
                    "SELECT body FROM webhook_pending WHERE workspace_id = ?1 AND delivery_id = ?2",
                )
                .and_then(|mut s| s.query_row(params![ws, id], |r| r.get(0)).optional())
                .map_err(sql)?;
            body.as_deref().map(from_json).transpose()
        })
        .await
    }

    async fn pending_deliveries(&self, limit: usize) -> Result<Vec<(String, PendingDelivery)>> {
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT workspace_id, body FROM webhook_pending
                     ORDER BY due_at, delivery_id LIMIT ?1",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![limit_arg(limit)], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(sql)?;
            rows.map(|row| {
                let (ws, body) = row.map_err(sql)?;
                Ok((ws, from_json(&body)?))
            })
            .collect()
        })
        .await
    }

    async fn prune_webhook_log(&self, before_ms: i64, limit: usize) -> Result<Option<u64>> {
        self.write(move |conn| {
            let attempts = conn
                .prepare_cached(
                    "DELETE FROM webhook_attempts
                     WHERE (workspace_id, webhook_id, created_at, delivery_id, attempt) IN (
                        SELECT workspace_id, webhook_id, created_at, delivery_id, attempt
                        FROM webhook_attempts WHERE created_at < ?1 ORDER BY created_at LIMIT ?2)",
                )
                .and_then(|mut s| s.execute(params![before_ms, limit_arg(limit)]))
                .map_err(sql)?;
            let pending = conn
                .prepare_cached("DELETE FROM webhook_pending WHERE due_at < ?1")
                .and_then(|mut s| s.execute(params![before_ms]))
                .map_err(sql)?;
            Ok(Some((attempts + pending) as u64))
        })
        .await
    }

    async fn list_webhook_attempts(
        &self,
        ws: &str,
        webhook_id: &str,
        limit: usize,
    ) -> Result<Vec<WebhookAttempt>> {
        let (ws, webhook_id) = (ws.to_owned(), webhook_id.to_owned());
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT body FROM webhook_attempts WHERE workspace_id = ?1 AND webhook_id = ?2
                     ORDER BY created_at DESC, delivery_id DESC, attempt DESC LIMIT ?3",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![ws, webhook_id, limit_arg(limit)], |r| r.get::<_, String>(0))
                .map_err(sql)?;
            rows.map(|row| from_json(&row.map_err(sql)?)).collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test]
    async fn a_deleted_webhook_keeps_no_secret() {
        let (store, _dir) = crate::store::embedded::temp_store();
        let hook = crate::store::webhooks::test_webhook("whk_a");
        store.insert_webhook("ws", &hook).await.unwrap();
        assert!(store.delete_webhook("ws", "whk_a", 2).await.unwrap());
        let body = store
            .read(|conn| {
                conn.query_row("SELECT body FROM webhooks WHERE id = 'whk_a'", [], |r| {
                    r.get::<_, String>(0)
                })
                .map_err(sql)
            })
            .await
            .unwrap();
        assert!(!body.contains("s3cret"), "{body}");
        assert!(body.contains("hooks.example/whk_a"), "the rest stays: {body}");
    }
}
