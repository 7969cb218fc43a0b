//! `QueryStore` on ClickHouse, each call handed to the module that does it;
//! `docs/storage.md` lists what is done.

use async_trait::async_trait;

use super::ClickHouseStore;
use crate::error::Result;
use crate::store::StoredEvent;
use crate::store::queries::{
    ActorActivity, Attribution, AttributionQuery, ConnectorLoad, Entity, FunnelQuery,
    MetricDefinition, MetricSnapshot, QueryStore, Range, Relationship, RunQuery, RunSummary,
    SearchQuery, SearchResult, SeriesPoint, SeriesQuery, Totals, TotalsQuery,
};

#[async_trait]
impl QueryStore for ClickHouseStore {
    async fn event_totals(&self, ws: &str, query: &TotalsQuery) -> Result<Totals> {
        super::queries::totals(self, ws, query).await
    }
    async fn event_series(&self, ws: &str, query: &SeriesQuery) -> Result<Vec<SeriesPoint>> {
        super::queries::series(self, ws, query).await
    }
    async fn funnel(&self, ws: &str, query: &FunnelQuery) -> Result<Vec<u64>> {
        super::queries::funnel(self, ws, query).await
    }
    async fn attribution(&self, ws: &str, query: &AttributionQuery) -> Result<Attribution> {
        super::attribution::attribution(self, ws, query).await
    }
    async fn search_events(&self, ws: &str, query: &SearchQuery) -> Result<SearchResult> {
        super::queries::search(self, ws, query).await
    }
    async fn runs(&self, ws: &str, query: &RunQuery) -> Result<Vec<RunSummary>> {
        super::queries::runs(self, ws, query).await
    }
    async fn actor_activity(
        &self,
        ws: &str,
        range: Range,
        types: &[&str],
        actor_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ActorActivity>> {
        super::queries::actor_activity(self, ws, range, types, actor_id, limit).await
    }
    async fn proof_gaps(
        &self,
        ws: &str,
        range: Range,
        business_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        super::queries::proof_gaps(self, ws, range, business_id, limit).await
    }
    async fn connector_loads(
        &self,
        ws: &str,
        since: i64,
        limit: usize,
    ) -> Result<Vec<ConnectorLoad>> {
        super::connectors::loads(self, ws, since, limit).await
    }
    async fn business_exists(&self, ws: &str, business_id: &str) -> Result<bool> {
        self.business_exists_impl(ws, business_id).await
    }
    async fn list_entities(
        &self,
        ws: &str,
        kind: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Entity>> {
        super::graph::list_entities(self, ws, kind, limit).await
    }
    async fn list_relationships(
        &self,
        ws: &str,
        node: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<Relationship>> {
        super::graph::list_relationships(self, ws, node, limit).await
    }
    async fn insert_metric_definition(
        &self,
        ws: &str,
        definition: &MetricDefinition,
    ) -> Result<()> {
        let item = (definition.id.as_str(), definition.created_at, definition);
        super::queries::insert_bodies(self, "metric_definitions", ws, &[item]).await
    }
    async fn list_metric_definitions(
        &self,
        ws: &str,
        limit: usize,
    ) -> Result<Vec<MetricDefinition>> {
        super::queries::list_metric_definitions(self, ws, limit).await
    }
    async fn evaluate_metric(
        &self,
        ws: &str,
        definition: &MetricDefinition,
        range: Range,
        business_id: Option<&str>,
    ) -> Result<(u64, f64)> {
        super::queries::evaluate_metric(self, ws, definition, range, business_id).await
    }
    async fn insert_metric_snapshots(&self, ws: &str, snapshots: &[MetricSnapshot]) -> Result<()> {
        let items: Vec<_> = snapshots.iter().map(|s| (s.id.as_str(), s.created_at, s)).collect();
        super::queries::insert_bodies(self, "metric_snapshots", ws, &items).await
    }
    async fn list_metric_snapshots(&self, ws: &str, limit: usize) -> Result<Vec<MetricSnapshot>> {
        super::queries::list_metric_snapshots(self, ws, limit).await
    }
}
