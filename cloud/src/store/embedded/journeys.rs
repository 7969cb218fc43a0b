//! Journeys of the embedded store: funnels and attribution, the two
//! queries that follow each actor's events in time order (docs/queries.md).
//!
//! - Funnels read the step events of the range from the `(workspace,
//!   event, ts, actor)` index, one cursor per step event, merge the
//!   cursors by time and feed each row to its actor's state in
//!   [`WindowFunnel`], which works like ClickHouse's `windowFunnel`: one
//!   pass, keeping per step the latest start that reached it, so a late
//!   restart within the window is found and an out-of-order step never
//!   counts. No row is kept; grouping in SQL instead meant sorting every
//!   row by actor text in SQLite's sorter, four times slower.
//! - Attribution sees each conversion's touchpoints through window frames
//!   over the actor's conversions and touchpoints (no join: a join's plan
//!   depended on statistics and could degrade to a nested loop) and sums
//!   credit per touchpoint key, split into dimensions here.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use rusqlite::Connection;

use super::queries::Sql;
use super::sql;
use crate::error::Result;
use crate::store::queries::{
    Attribution, AttributionModel, AttributionQuery, AttributionSums, FunnelQuery, NO_KEY,
};

/// No start yet.
const NO_START: i64 = i64::MIN;

/// Every actor's progress: the number of leading steps it completed in
/// order. Rows come in time order; `mask` has bit `k` set when the row is
/// an event of step `k`. For each actor and step the state keeps the
/// latest start time of a chain that reached it (a later start leaves more
/// of the window); steps are tried from the last down, so one row never
/// advances two steps.
struct WindowFunnel {
    window: i64,
    start_before: i64,
    steps: usize,
    /// `steps` entries per actor.
    starts: Vec<i64>,
}

impl WindowFunnel {
    fn add_actor(&mut self) {
        self.starts.extend(std::iter::repeat_n(NO_START, self.steps));
    }

    fn step(&mut self, actor: usize, mask: u32, ts: i64) {
        let Some(starts) = self.starts.get_mut(actor * self.steps..(actor + 1) * self.steps) else {
            return;
        };
        for k in (0..starts.len()).rev() {
            if mask & (1 << k) == 0 {
                continue;
            }
            if k == 0 {
                if ts < self.start_before {
                    starts[0] = ts;
                }
            } else if starts[k - 1] != NO_START && ts - starts[k - 1] <= self.window {
                starts[k] = starts[k - 1];
            }
        }
    }

    fn levels(&self) -> impl Iterator<Item = usize> + '_ {
        self.starts
            .chunks(self.steps.max(1))
            .map(|s| s.iter().rposition(|&t| t != NO_START).map_or(0, |k| k + 1))
    }
}

/// Dense ids for the actor texts a funnel meets. Each text is copied once
/// into one arena and found again through a fast hash of its bytes, so a
/// row costs no allocation and no UTF-8 check: with a `HashMap<String, _>`
/// those took about a third of the funnel's CPU (BENCHMARKS.md).
#[derive(Default)]
struct Interner {
    /// Ids, by the hash of their text.
    table: HashTable<usize>,
    /// Where each id's text ends in `arena` (it starts where the previous
    /// one ends).
    ends: Vec<usize>,
    arena: Vec<u8>,
    hasher: hashbrown::DefaultHashBuilder,
}

fn interned<'a>(arena: &'a [u8], ends: &[usize], id: usize) -> &'a [u8] {
    let start = id.checked_sub(1).map_or(0, |previous| ends[previous]);
    &arena[start..ends[id]]
}

impl Interner {
    /// The id of `text`, and whether it is new.
    fn id(&mut self, text: &[u8]) -> (usize, bool) {
        let Interner { table, ends, arena, hasher } = self;
        let hash = hasher.hash_one(text);
        let entry = table.entry(
            hash,
            |&id| interned(arena, ends, id) == text,
            |&id| hasher.hash_one(interned(arena, ends, id)),
        );
        match entry {
            Entry::Occupied(found) => (*found.get(), false),
            Entry::Vacant(slot) => {
                let id = ends.len();
                arena.extend_from_slice(text);
                ends.push(arena.len());
                slot.insert(id);
                (id, true)
            }
        }
    }
}

/// The next row of one step event's cursor, its actor interned.
#[derive(Clone, Copy)]
struct Head {
    actor: usize,
    ts: i64,
    seq: i64,
}

fn next_head(
    rows: &mut rusqlite::Rows<'_>,
    actors: &mut Interner,
    state: &mut WindowFunnel,
) -> Result<Option<Head>> {
    let Some(row) = rows.next().map_err(sql)? else {
        return Ok(None);
    };
    let actor = row.get_ref(0).and_then(|v| Ok(v.as_bytes()?)).map_err(sql)?;
    let (actor, new) = actors.id(actor);
    if new {
        state.add_actor();
    }
    Ok(Some(Head { actor, ts: row.get(1).map_err(sql)?, seq: row.get(2).map_err(sql)? }))
}

pub(super) fn funnel(conn: &Connection, ws: &str, query: &FunnelQuery) -> Result<Vec<u64>> {
    let steps = query.steps.len().min(31);
    // One cursor per distinct event name; a name used by several steps (a
    // repeated step) carries all their bits.
    let mut names: Vec<(&str, u32)> = Vec::new();
    for (k, step) in query.steps.iter().take(steps).enumerate() {
        match names.iter_mut().find(|(name, _)| *name == step.as_str()) {
            Some((_, mask)) => *mask |= 1 << k,
            None => names.push((step.as_str(), 1 << k)),
        }
    }
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":from", query.range.from);
    q.bind(":until", query.range.to.saturating_add(query.window_ms));
    let mut filter = String::new();
    if let Some(b) = &query.business_id {
        filter.push_str(" AND business_id = :biz");
        q.bind(":biz", b.clone());
    }
    let text = format!(
        "SELECT actor_id, ts, seq FROM events
         WHERE workspace_id = :ws AND event = :event AND ts >= :from AND ts < :until
           AND actor_id IS NOT NULL{filter}"
    );
    let binds: Vec<Sql> = names
        .iter()
        .map(|(name, _)| {
            let mut q = q.clone();
            q.bind(":event", (*name).to_owned());
            q
        })
        .collect();
    let params: Vec<_> = binds.iter().map(Sql::params).collect();
    // The same text runs once per name at the same time: prepared, not
    // cached (the cache hands out one statement per text).
    let mut statements = names
        .iter()
        .map(|_| conn.prepare(&text))
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql)?;
    let mut cursors = Vec::with_capacity(names.len());
    for (statement, params) in statements.iter_mut().zip(&params) {
        cursors.push(statement.query(params.as_slice()).map_err(sql)?);
    }
    // Each cursor is in (ts, seq) order (the index); merging them feeds
    // every actor's rows to the state in time order, with no row kept.
    let mut state = WindowFunnel {
        window: query.window_ms,
        start_before: query.range.to,
        steps,
        starts: Vec::new(),
    };
    let mut actors = Interner::default();
    let mut heads = Vec::with_capacity(cursors.len());
    for cursor in &mut cursors {
        heads.push(next_head(cursor, &mut actors, &mut state)?);
    }
    // Within one time, an index cursor is in actor order: the rows of
    // that time from every cursor are put in storage order first.
    let mut same_time: Vec<(i64, usize, u32)> = Vec::new();
    while let Some(ts) = heads.iter().flatten().map(|h| h.ts).min() {
        same_time.clear();
        for (i, cursor) in cursors.iter_mut().enumerate() {
            while let Some(head) = heads[i].take_if(|h| h.ts == ts) {
                same_time.push((head.seq, head.actor, names[i].1));
                heads[i] = next_head(cursor, &mut actors, &mut state)?;
            }
        }
        same_time.sort_unstable();
        for &(_, actor, mask) in &same_time {
            state.step(actor, mask, ts);
        }
    }
    let mut reached = vec![0u64; query.steps.len()];
    for level in state.levels() {
        for slot in reached.iter_mut().take(level) {
            *slot += 1;
        }
    }
    Ok(reached)
}

/// Separates a touchpoint's attributes in its key, and stands for an
/// absent one (never in real text: ASCII unit and record separators).
const SEP: char = '\u{1f}';
const NONE: char = '\u{1e}';

pub(super) fn attribution(
    conn: &Connection,
    ws: &str,
    query: &AttributionQuery,
) -> Result<Attribution> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":from", query.range.from);
    q.bind(":to", query.range.to);
    q.bind(":lookback", query.lookback_ms);
    let mut biz = String::new();
    if let Some(b) = &query.business_id {
        biz.push_str(" AND business_id = :biz");
        q.bind(":biz", b.clone());
    }
    // Without a conversion event, conversions are the events with revenue,
    // read through their partial index (schema.sql: `events_revenue`).
    let (conv_index, conversion) = match &query.conversion_event {
        Some(e) => {
            q.bind(":conv", e.clone());
            ("", "event = :conv")
        }
        None => (" INDEXED BY events_revenue", "revenue IS NOT NULL"),
    };
    // Each touchpoint as one text key of its four attributes; each
    // conversion sees its actor's touchpoints through a window frame
    // reaching `lookback` back (no join: one sort of the candidate rows).
    // `first`/`last` pick by the touchpoint's (ts, seq), packed in front
    // of its key; `linear` spreads each conversion over the `n`
    // touchpoints of its frame, summed per touchpoint by a frame reaching
    // `lookback` forward.
    let credit = match query.model {
        AttributionModel::FirstTouch | AttributionModel::LastTouch => {
            let pick = if query.model == AttributionModel::FirstTouch { "first" } else { "last" };
            format!(
                "SELECT 'c', substr({pick}, 31), count(*), sum(r) FROM w
                 WHERE is_conv = 1 AND n > 0 GROUP BY 2"
            )
        }
        AttributionModel::Linear => "SELECT 'c', k, sum(credit), sum(rev) FROM (
                SELECT is_conv, k,
                    sum(CASE WHEN is_conv = 1 AND n > 0 THEN 1.0 / n END) OVER fwd AS credit,
                    sum(CASE WHEN is_conv = 1 AND n > 0 THEN r / n END) OVER fwd AS rev
                FROM w
                WINDOW fwd AS (PARTITION BY a ORDER BY ts
                    RANGE BETWEEN CURRENT ROW AND :lookback FOLLOWING)
             ) WHERE is_conv = 0 AND credit > 0 GROUP BY k"
            .to_owned(),
    };
    let text = format!(
        "WITH conv AS MATERIALIZED (
            SELECT seq, actor_id AS a, ts, coalesce(revenue, 0) AS r FROM events{conv_index}
            WHERE workspace_id = :ws AND ts >= :from AND ts < :to AND {conversion}{biz}
         ),
         tp AS MATERIALIZED (
            SELECT seq, actor_id AS a, ts,
                coalesce(source, char(30)) || char(31) || coalesce(campaign, char(30))
                || char(31) || coalesce(channel, char(30)) || char(31)
                || coalesce(CASE WHEN object_id IS NULL THEN NULL
                                 WHEN object_type IS NULL THEN object_id
                                 ELSE object_type || ':' || object_id END, char(30)) AS k
            FROM events INDEXED BY events_touchpoint
            WHERE workspace_id = :ws AND ts >= :from - :lookback AND ts < :to
              AND actor_id IS NOT NULL
              AND (source IS NOT NULL OR campaign IS NOT NULL OR channel IS NOT NULL){biz}
         ),
         w AS MATERIALIZED (
            SELECT a, ts, is_conv, r, k,
                sum(1 - is_conv) OVER back AS n,
                min(CASE WHEN is_conv = 0 THEN printf('%015d%015d', ts, seq) || k END)
                    OVER back AS first,
                max(CASE WHEN is_conv = 0 THEN printf('%015d%015d', ts, seq) || k END)
                    OVER back AS last
            FROM (SELECT a, ts, seq, 1 AS is_conv, r, NULL AS k FROM conv WHERE a IS NOT NULL
                  UNION ALL SELECT a, ts, seq, 0, 0, k FROM tp)
            WINDOW back AS (PARTITION BY a ORDER BY ts
                RANGE BETWEEN :lookback PRECEDING AND CURRENT ROW)
         )
         {credit}
         UNION ALL SELECT 't', k, count(*), 0 FROM tp WHERE ts >= :from GROUP BY k
         UNION ALL SELECT 'n', '', count(*), coalesce(sum(r), 0) FROM conv
         UNION ALL SELECT 'a', '', count(*), 0 FROM w WHERE is_conv = 1 AND n > 0"
    );
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, f64>(2)?,
                r.get::<_, f64>(3)?,
            ))
        })
        .map_err(sql)?;
    let mut sums = AttributionSums::default();
    let (mut conversions, mut revenue, mut attributed) = (0, 0.0, 0);
    for row in rows {
        let (kind, key, a, b) = row.map_err(sql)?;
        match kind.as_str() {
            "c" | "t" => {
                let mut parts =
                    key.split(SEP).map(|p| if p.starts_with(NONE) { NO_KEY } else { p });
                let keys = [(); 4].map(|()| parts.next().unwrap_or(NO_KEY));
                if kind == "c" {
                    sums.add(keys, 0, a, b);
                } else {
                    sums.add(keys, a.max(0.0) as u64, 0.0, 0.0);
                }
            }
            "n" => {
                conversions = a.max(0.0) as u64;
                revenue = b;
            }
            _ => attributed = a.max(0.0) as u64,
        }
    }
    Ok(sums.into_attribution(conversions, revenue, attributed, query.limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewEvent;
    use crate::store::embedded::{append_in_transaction, open_writer_connection, prepare_events};
    use crate::store::queries::Range;

    #[test]
    fn steps_at_the_same_time_count_in_storage_order() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer_connection(dir.path()).unwrap();
        // (actor, event, ts), stored in this order: user-a views then buys
        // in the same millisecond, user-b buys then views.
        let stored = [
            ("user-a", "page.view", 10),
            ("user-a", "order.created", 10),
            ("user-b", "order.created", 10),
            ("user-b", "page.view", 10),
            ("user-c", "page.view", 7),
        ];
        let events = stored
            .iter()
            .enumerate()
            .map(|(i, (actor, name, ts))| {
                let mut e = opgraph_proto::Event::named(*name);
                e.actor = Some(opgraph_proto::Party::Name((*actor).into()));
                e.timestamp = Some(*ts);
                NewEvent { id: format!("evt_{i}"), received_at: 0, event: e }
            })
            .collect();
        append_in_transaction(&conn, "ws", prepare_events(events), None).unwrap();
        let query = FunnelQuery {
            steps: vec!["page.view".into(), "order.created".into()],
            range: Range { from: 0, to: 100 },
            window_ms: 5,
            business_id: None,
        };
        assert_eq!(funnel(&conn, "ws", &query).unwrap(), [3, 1]);
    }

    proptest::proptest! {
        /// Equal texts get one id and different texts different ids, ids
        /// in order of first appearance, as a map of strings gives them;
        /// texts that are prefixes of others and the empty text included.
        #[test]
        fn interner_ids_match_a_map_of_strings(texts in proptest::collection::vec("[ab]{0,3}", 0..60)) {
            let mut interner = Interner::default();
            let mut reference: std::collections::HashMap<&str, usize> = Default::default();
            for text in &texts {
                let next = reference.len();
                let expected = *reference.entry(text).or_insert(next);
                proptest::prop_assert_eq!(
                    interner.id(text.as_bytes()),
                    (expected, expected == next)
                );
            }
        }
    }
}
