//! Scale-out: the store on a ClickHouse cluster (`store.clickhouse_cluster`,
//! `deploy/clickhouse/cluster/`, `docs/storage.md`).
//!
//! Every table of `schema.sql` becomes two on each node, created `ON
//! CLUSTER`: `<name>_local`, the same table on the Replicated variant of its
//! engine, and `<name>`, a Distributed table over the local ones. The store's
//! SQL names the Distributed tables and so reads and writes the same way on
//! one server and on a cluster.
//!
//! Why the answers stay exact:
//! - Each row goes to the shard `cityHash64(<the table's ORDER BY key>)`
//!   picks. All versions of one metadata row share that key, so they land
//!   on one shard and `argMax(.., version)` or `FINAL` folds them there; an
//!   event redelivered with the same id lands where its first copy is.
//! - `insert_distributed_sync = 1`: an insert answers once every shard has
//!   its rows, so the lookups that make appends exactly-once (and the
//!   gateway's ack) see everything acknowledged before them.
//! - With replicas, `insert_quorum` = the replicas of a shard: an answered
//!   insert is on every replica, so a read served by any replica (after a
//!   failover too) sees it, and losing a replica loses nothing acknowledged.
//!   ClickHouse before 20.x refuses a second quorum insert into a table
//!   while one is running, so this process sends one insert per table at a
//!   time (see [`super::ClickHouseStore::insert_rows`]).

use clickhouse::{Client, Row};
use serde::Deserialize;

use super::Sent;
use crate::error::{Error, Result};

/// How the store is laid out on a cluster, read from `system.clusters`.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    /// The store's database: `ON CLUSTER` DDL runs on the other nodes
    /// without the session's current database (18.16), so it names it.
    pub database: String,
    /// Replicas per shard (the most any shard has).
    pub replicas: u64,
}

#[derive(Row, Deserialize)]
struct ClusterRead {
    shards: u64,
    replicas: u64,
}

impl Cluster {
    /// The cluster `name` as the server at `client` knows it, for the
    /// store's `database`; an error when its `remote_servers` do not define
    /// it.
    pub(super) async fn read(client: &Client, name: &str, database: &str) -> Result<Cluster> {
        if !super::plain_identifier(name) {
            return Err(Error::validation(
                "store.clickhouse_cluster",
                "letters, digits and '_' only, not starting with a digit",
            ));
        }
        let read: ClusterRead = super::retried(|| {
            client
                .query(
                    "SELECT uniqExact(shard_num), toUInt64(max(replica_num)) FROM system.clusters
                     WHERE cluster = ?",
                )
                .bind(name)
                .sent()
                .fetch_one()
        })
        .await?;
        if read.shards == 0 {
            return Err(Error::validation(
                "store.clickhouse_cluster",
                format!("the server's remote_servers define no cluster {name:?}"),
            ));
        }
        tracing::info!(
            cluster = name,
            shards = read.shards,
            replicas = read.replicas,
            "ClickHouse cluster"
        );
        Ok(Cluster {
            name: name.to_owned(),
            database: database.to_owned(),
            replicas: read.replicas,
        })
    }

    /// Settings sent with every query.
    pub(super) fn options(&self) -> Vec<(&'static str, String)> {
        let mut options = vec![
            ("insert_distributed_sync", "1".to_owned()),
            // The first live replica of each shard in configuration order
            // serves reads and inserts alike.
            ("load_balancing", "in_order".to_owned()),
            // Replicated tables drop an inserted block identical to a recent
            // one. Identical blocks are legitimate here (two syncs adding
            // the same usage increment, identical edge observations) and
            // the store makes appends exactly-once itself, as on one server.
            ("insert_deduplicate", "0".to_owned()),
        ];
        if self.replicas > 1 {
            options.push(("insert_quorum", self.replicas.to_string()));
            // The server stops waiting for the quorum before the store
            // stops waiting for the server (QUERY_TIMEOUT, 30 s).
            options.push(("insert_quorum_timeout", "25000".to_owned()));
        }
        options
    }

    /// `<database>.<table>_local ON CLUSTER <name>`: where an `ALTER` of
    /// `table` goes (a Distributed table takes no mutation). On replicated
    /// tables ClickHouse runs it on one replica per shard and the others
    /// follow through the replication log.
    pub(super) fn local_table(&self, table: &str) -> String {
        format!("{}.{table}_local ON CLUSTER {}", self.database, self.name)
    }

    /// The statements of `schema.sql` for this cluster: each table as a
    /// replicated local table and a Distributed table over it.
    pub fn statements(&self, database: &str, statements: &[String]) -> Result<Vec<String>> {
        let mut out = Vec::with_capacity(statements.len() * 2);
        for statement in statements {
            let table = Table::parse(statement).ok_or_else(|| {
                Error::internal(format!(
                    "schema.sql: cannot lay this statement out on a cluster: {statement}"
                ))
            })?;
            out.extend(table.on_cluster(&self.name, database));
        }
        Ok(out)
    }
}

/// One `CREATE TABLE IF NOT EXISTS name (columns) ENGINE = Engine(args) rest`.
struct Table<'a> {
    name: &'a str,
    columns: &'a str,
    engine: &'a str,
    args: &'a str,
    /// `PARTITION BY ... ORDER BY ...` and whatever follows.
    rest: &'a str,
}

impl<'a> Table<'a> {
    fn parse(statement: &'a str) -> Option<Table<'a>> {
        let after = statement.strip_prefix("CREATE TABLE IF NOT EXISTS")?.trim_start();
        let open = after.find('(')?;
        let name = after[..open].trim();
        let close = open + matching(&after[open..])?;
        let columns = &after[open + 1..close];
        let engine_part = after[close + 1..].trim_start().strip_prefix("ENGINE")?;
        let engine_part = engine_part.trim_start().strip_prefix('=')?.trim_start();
        let open = engine_part.find('(')?;
        let engine = engine_part[..open].trim();
        let close = open + matching(&engine_part[open..])?;
        let args = engine_part[open + 1..close].trim();
        let rest = engine_part[close + 1..].trim();
        let plain =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        (plain(name) && plain(engine) && engine.ends_with("MergeTree") && rest.contains("ORDER BY"))
            .then_some(Table { name, columns, engine, args, rest })
    }

    /// The columns of the `ORDER BY` key, as `cityHash64`'s arguments.
    fn sharding_key(&self) -> String {
        let key = self.rest.split("ORDER BY").nth(1).unwrap_or_default().trim();
        let key = match key.strip_prefix('(') {
            Some(inner) => &inner[..matching(key).map_or(inner.len(), |close| close - 1)],
            None => key.split_whitespace().next().unwrap_or_default(),
        };
        format!("cityHash64({})", key.trim())
    }

    fn on_cluster(&self, cluster: &str, database: &str) -> [String; 2] {
        let Table { name, columns, engine, args, rest } = self;
        // `{shard}` and `{replica}` are each node's macros.
        let path = format!("'/clickhouse/tables/{{shard}}/{database}/{name}', '{{replica}}'");
        let args = if args.is_empty() { path } else { format!("{path}, {args}") };
        let local = format!(
            "CREATE TABLE IF NOT EXISTS {database}.{name}_local ON CLUSTER {cluster} ({columns})
ENGINE = Replicated{engine}({args}) {rest}"
        );
        let distributed = format!(
            "CREATE TABLE IF NOT EXISTS {database}.{name} ON CLUSTER {cluster} ({columns})
ENGINE = Distributed({cluster}, {database}, {name}_local, {})",
            self.sharding_key()
        );
        [local, distributed]
    }
}

/// The byte offset of the parenthesis closing the one `text` opens with.
fn matching(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(replicas: u64) -> Cluster {
        Cluster { name: "opgraph".into(), database: "db".into(), replicas }
    }

    #[test]
    fn every_schema_table_gets_a_replicated_local_and_a_distributed_table() {
        let plain = super::super::schema_statements();
        let laid_out = cluster(2).statements("db", &plain).unwrap();
        assert_eq!(laid_out.len(), plain.len() * 2);
        for pair in laid_out.chunks(2) {
            assert!(pair[0].contains("_local ON CLUSTER opgraph"), "{}", pair[0]);
            assert!(pair[0].contains("ENGINE = Replicated"), "{}", pair[0]);
            assert!(pair[1].contains("ENGINE = Distributed(opgraph, db, "), "{}", pair[1]);
        }
    }

    #[test]
    fn rows_are_sharded_by_their_sorting_key_and_engine_arguments_kept() {
        let statement = "CREATE TABLE IF NOT EXISTS gateway_sessions (
    workspace_id String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, gateway_id)";
        let [local, distributed] = Table::parse(statement).unwrap().on_cluster("c", "db");
        assert!(
            local
                .starts_with("CREATE TABLE IF NOT EXISTS db.gateway_sessions_local ON CLUSTER c (")
        );
        assert!(local.ends_with(
            "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/gateway_sessions', \
             '{replica}', version) ORDER BY (workspace_id, gateway_id)"
        ));
        assert!(distributed.ends_with(
            "ENGINE = Distributed(c, db, gateway_sessions_local, cityHash64(workspace_id, gateway_id))"
        ));
        let single = "CREATE TABLE IF NOT EXISTS w (id String) ENGINE = MergeTree() ORDER BY id";
        let [local, distributed] = Table::parse(single).unwrap().on_cluster("c", "db");
        assert!(local.contains(
            "ReplicatedMergeTree('/clickhouse/tables/{shard}/db/w', '{replica}') ORDER BY id"
        ));
        assert!(distributed.ends_with("cityHash64(id))"));
    }

    #[test]
    fn statements_it_cannot_lay_out_are_an_error() {
        for statement in [
            "ALTER TABLE events ADD COLUMN x String",
            "CREATE TABLE IF NOT EXISTS v (x String) ENGINE = Memory",
            "CREATE TABLE IF NOT EXISTS t (x String) ENGINE = MergeTree()",
        ] {
            assert!(cluster(1).statements("db", &[statement.to_owned()]).is_err(), "{statement}");
        }
    }

    #[test]
    fn mutations_go_to_every_shards_local_table() {
        assert_eq!(cluster(2).local_table("events"), "db.events_local ON CLUSTER opgraph");
    }

    #[test]
    fn quorum_only_with_replicas() {
        let options =
            |replicas| cluster(replicas).options().into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert!(!options(1).contains(&"insert_quorum"));
        assert!(options(2).contains(&"insert_quorum"));
        assert!(options(1).contains(&"insert_distributed_sync"));
        assert!(options(1).contains(&"insert_deduplicate"));
    }
}
