//! Trackables in the store: registration, lookup by id, by code within a
//! workspace, and by scan code for the public redirect; usage computed from
//! the events that carry the trackable's code.
//!
//! Every call but [`TrackableStore::scan_target`] is scoped to a workspace.
//! That one is the public `GET /r/{code}` lookup, which has no credential:
//! scan codes are unique across workspaces, and the answer names the
//! workspace that everything afterwards is scoped to.

use async_trait::async_trait;

use crate::error::Result;
use crate::trackables::TrackableKind;

/// A registered trackable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trackable {
    /// `trk_...`
    pub id: String,
    /// Unique in its workspace; what events carry in `trackable.code`.
    pub code: String,
    /// Unique across workspaces; the last segment of the scan URL.
    pub scan_code: String,
    pub kind: TrackableKind,
    pub name: String,
    pub target_url: Option<String>,
    pub event_name: Option<String>,
    pub created_at: i64,
}

/// How much a trackable was used: events of its workspace carrying its
/// code, whatever their source (scans, `/api/track`, ingest, gateways).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrackableUsage {
    pub count: u64,
    /// Event time of the latest, ms since the epoch.
    pub last_used_at: Option<i64>,
}

/// What registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateTrackable {
    Created,
    /// The workspace has a trackable with this code; nothing was stored.
    CodeTaken,
    /// Some workspace has a trackable with this scan code; nothing was
    /// stored (the caller draws another).
    ScanCodeTaken,
}

/// The answer of a public scan lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanTarget {
    pub workspace_id: String,
    pub trackable: Trackable,
}

#[async_trait]
pub trait TrackableStore: Send + Sync {
    /// Registers a trackable unless its code or scan code is taken.
    async fn create_trackable(
        &self,
        workspace_id: &str,
        trackable: &Trackable,
    ) -> Result<CreateTrackable>;
    /// Newest first.
    async fn list_trackables(&self, workspace_id: &str, limit: usize) -> Result<Vec<Trackable>>;
    /// One trackable with its usage; `None` when it is not in this workspace.
    async fn get_trackable(
        &self,
        workspace_id: &str,
        id: &str,
    ) -> Result<Option<(Trackable, TrackableUsage)>>;
    async fn trackable_by_code(&self, workspace_id: &str, code: &str) -> Result<Option<Trackable>>;
    /// The trackable a public scan URL names, in whichever workspace.
    async fn scan_target(&self, scan_code: &str) -> Result<Option<ScanTarget>>;
}
