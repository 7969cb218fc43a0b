//! Webhooks on ClickHouse: subscriptions in a ReplacingMergeTree (a
//! deletion is a newer version; reads take `argMax(..., version)` per id,
//! exact before and after merges) and the attempt log appended row by row.

use async_trait::async_trait;
use clickhouse::Row;
use serde::{Deserialize, Serialize};

use super::governance::limit_arg;
use super::{ClickHouseStore, Sent, run};
use crate::error::Result;
use crate::store::governance::{from_json, to_json};
use crate::store::webhooks::{PendingDelivery, Webhook, WebhookAttempt, WebhookStore};

#[derive(Row, Serialize)]
struct WebhookRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    deleted_at: i64,
    body: &'a str,
    version: u64,
}

#[derive(Row, Serialize)]
struct AttemptRow<'a> {
    workspace_id: &'a str,
    webhook_id: &'a str,
    created_at: i64,
    delivery_id: &'a str,
    attempt: u32,
    body: &'a str,
}

#[derive(Row, Serialize)]
struct PendingRow<'a> {
    workspace_id: &'a str,
    delivery_id: &'a str,
    due_at: i64,
    done: u8,
    body: &'a str,
    version: u64,
}

#[derive(Row, Deserialize)]
struct PendingRead {
    workspace_id: String,
    body: String,
}

#[async_trait]
impl WebhookStore for ClickHouseStore {
    async fn insert_webhook(&self, ws: &str, webhook: &Webhook) -> Result<()> {
        let body = to_json(webhook)?;
        let row = WebhookRow {
            workspace_id: ws,
            id: &webhook.id,
            deleted_at: 0,
            body: &body,
            version: self.clock.next(),
        };
        self.insert_rows::<WebhookRow<'_>>("webhooks", &[row]).await
    }

    async fn list_webhooks(&self, ws: &str, limit: usize) -> Result<Vec<Webhook>> {
        let bodies: Vec<String> = run(self
            .client
            .query(
                "SELECT argMax(body, version) FROM webhooks WHERE workspace_id = ?
                 GROUP BY id HAVING argMax(deleted_at, version) = 0 ORDER BY id LIMIT ?",
            )
            .bind(ws)
            .bind(limit_arg(limit))
            .sent()
            .fetch_all())
        .await?;
        bodies.iter().map(|body| from_json(body)).collect()
    }

    async fn workspaces_with_webhooks(&self) -> Result<Vec<String>> {
        run(self
            .client
            .query(
                "SELECT DISTINCT workspace_id FROM (
                    SELECT workspace_id, id FROM webhooks GROUP BY workspace_id, id
                    HAVING argMax(deleted_at, version) = 0
                 ) ORDER BY workspace_id",
            )
            .sent()
            .fetch_all())
        .await
    }

    async fn delete_webhook(&self, ws: &str, id: &str, at_ms: i64) -> Result<bool> {
        // Read and mark under the workspace's lock, so that two deletions
        // of this process agree on which one deleted.
        let lock = self.lock_for(ws)?;
        let _guard = lock.lock().await;
        let current: Vec<String> = run(self
            .client
            .query(
                "SELECT argMax(body, version) FROM webhooks WHERE workspace_id = ? AND id = ?
                 GROUP BY id HAVING argMax(deleted_at, version) = 0",
            )
            .bind(ws)
            .bind(id)
            .sent()
            .fetch_all())
        .await?;
        let Some(body) = current.first() else {
            return Ok(false);
        };
        // The row stays, so that its log stays explained; its secret has
        // no use left and goes, from the older version too once the table
        // is merged (right away: deletions are rare and the table small).
        let mut hook: Webhook = from_json(body)?;
        hook.secret.clear();
        let body = to_json(&hook)?;
        let row = WebhookRow {
            workspace_id: ws,
            id,
            deleted_at: at_ms.max(1),
            body: &body,
            version: self.clock.next(),
        };
        self.insert_rows::<WebhookRow<'_>>("webhooks", &[row]).await?;
        let merge = format!("OPTIMIZE TABLE {} FINAL", self.mutation_target("webhooks"));
        if let Err(error) = run(self.client.query(&merge).sent().execute()).await {
            tracing::warn!(%error, "webhooks not merged; a deleted secret stays until the next merge");
        }
        Ok(true)
    }

    async fn insert_webhook_attempt(&self, ws: &str, attempt: &WebhookAttempt) -> Result<()> {
        let body = to_json(attempt)?;
        let row = AttemptRow {
            workspace_id: ws,
            webhook_id: &attempt.webhook_id,
            created_at: attempt.created_at,
            delivery_id: &attempt.delivery_id,
            attempt: attempt.attempt,
            body: &body,
        };
        self.insert_rows::<AttemptRow<'_>>("webhook_attempts", &[row]).await
    }

    async fn save_pending_delivery(&self, ws: &str, pending: &PendingDelivery) -> Result<()> {
        let body = to_json(pending)?;
        let row = PendingRow {
            workspace_id: ws,
            delivery_id: &pending.delivery_id,
            due_at: pending.due_at,
            done: 0,
            body: &body,
            version: self.clock.next(),
        };
        self.insert_rows::<PendingRow<'_>>("webhook_pending", &[row]).await
    }

    async fn finish_pending_delivery(&self, ws: &str, delivery_id: &str) -> Result<()> {
        let row = PendingRow {
            workspace_id: ws,
            delivery_id,
            // When it finished, so that retention keeps it as long as the
            // versions before it (see `prune_webhook_log`).
            due_at: crate::now_ms(),
            done: 1,
            body: "",
            version: self.clock.next(),
        };
        self.insert_rows::<PendingRow<'_>>("webhook_pending", &[row]).await
    }

    async fn pending_delivery(
        &self,
        ws: &str,
        delivery_id: &str,
    ) -> Result<Option<PendingDelivery>> {
        let rows: Vec<PendingRead> = run(self
            .client
            .query(
                "SELECT workspace_id, argMax(body, version) AS p_body FROM webhook_pending
                 WHERE workspace_id = ? AND delivery_id = ?
                 GROUP BY workspace_id, delivery_id HAVING argMax(done, version) = 0",
            )
            .bind(ws)
            .bind(delivery_id)
            .sent()
            .fetch_all())
        .await?;
        rows.first().map(|r| from_json(&r.body)).transpose()
    }

    fn shared_between_processes(&self) -> bool {
        true
    }

    async fn pending_deliveries(&self, limit: usize) -> Result<Vec<(String, PendingDelivery)>> {
        let rows: Vec<PendingRead> = run(self
            .client
            .query(
                "SELECT workspace_id, argMax(body, version) AS p_body FROM webhook_pending
                 GROUP BY workspace_id, delivery_id HAVING argMax(done, version) = 0
                 ORDER BY argMax(due_at, version), delivery_id LIMIT ?",
            )
            .bind(limit_arg(limit))
            .sent()
            .fetch_all())
        .await?;
        rows.into_iter().map(|r| Ok((r.workspace_id, from_json(&r.body)?))).collect()
    }

    /// Two `ALTER TABLE ... DELETE` mutations, which ClickHouse applies in
    /// the background. A finished delivery has several versions, the last
    /// one `done`; deleting that one alone would make the delivery pending
    /// again, so the table is first merged down to one version per
    /// delivery. A version written after the merge is due (or finished)
    /// after `before_ms` and stays.
    async fn prune_webhook_log(&self, before_ms: i64, _limit: usize) -> Result<Option<u64>> {
        let statements = [
            format!(
                "ALTER TABLE {} DELETE WHERE created_at < {before_ms}",
                self.mutation_target("webhook_attempts")
            ),
            format!("OPTIMIZE TABLE {} FINAL", self.mutation_target("webhook_pending")),
            format!(
                "ALTER TABLE {} DELETE WHERE due_at < {before_ms}",
                self.mutation_target("webhook_pending")
            ),
        ];
        for statement in statements {
            run(self.client.query(&statement).sent().execute()).await?;
        }
        Ok(None)
    }

    async fn list_webhook_attempts(
        &self,
        ws: &str,
        webhook_id: &str,
        limit: usize,
    ) -> Result<Vec<WebhookAttempt>> {
        let bodies: Vec<String> = run(self
            .client
            .query(
                "SELECT any(body) FROM webhook_attempts WHERE workspace_id = ? AND webhook_id = ?
                 GROUP BY created_at, delivery_id, attempt
                 ORDER BY created_at DESC, delivery_id DESC, attempt DESC LIMIT ?",
            )
            .bind(ws)
            .bind(webhook_id)
            .bind(limit_arg(limit))
            .sent()
            .fetch_all())
        .await?;
        bodies.iter().map(|body| from_json(body)).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test]
    async fn a_deleted_webhook_keeps_no_secret() {
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        let hook = crate::store::webhooks::test_webhook("whk_a");
        store.insert_webhook("ws", &hook).await.unwrap();
        assert!(store.delete_webhook("ws", "whk_a", 2).await.unwrap());
        let bodies: Vec<String> =
            store.client.query("SELECT body FROM webhooks").fetch_all().await.unwrap();
        assert_eq!(bodies.len(), 1, "merged to one version: {bodies:?}");
        assert!(!bodies[0].contains("s3cret"), "{bodies:?}");
        assert!(store.list_webhooks("ws", 10).await.unwrap().is_empty());
    }
}
