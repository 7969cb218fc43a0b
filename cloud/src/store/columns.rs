//! What every backend lifts out of an event for its own columns: text and
//! numbers at a key of the envelope's maps, and the searchable text. One
//! place, so that a query answers alike on every backend.

use std::fmt::Write as _;

use opgraph_proto::Event;
use serde_json::{Map, Value};

/// Searchable text per event is capped: search is for finding events, not
/// for indexing megabytes of payload.
pub const MAX_SEARCH_TEXT: usize = 2048;

/// A string, or a number as written, at `key`.
pub fn text_at(map: Option<&Map<String, Value>>, key: &str) -> Option<String> {
    match map?.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A finite number, or a string that parses as one, at `key`.
pub fn number_at(map: Option<&Map<String, Value>>, key: &str) -> Option<f64> {
    match map?.get(key)? {
        Value::Number(n) => n.as_f64().filter(|v| v.is_finite()),
        Value::String(s) => s.parse::<f64>().ok().filter(|v| v.is_finite()),
        _ => None,
    }
}

/// The event name, the non-empty `parts` (actor and object type and id),
/// then the scalar leaves of the properties, space-separated, cut at
/// [`MAX_SEARCH_TEXT`] on a character boundary.
pub fn search_text<'a>(e: &Event, parts: impl IntoIterator<Item = &'a str>) -> String {
    search_text_of(&e.event, parts, e.properties.as_ref())
}

/// [`search_text`] from the event name and properties alone, for a backend
/// that reads them back from its columns and stored envelope.
pub fn search_text_of<'a>(
    name: &str,
    parts: impl IntoIterator<Item = &'a str>,
    properties: Option<&Map<String, Value>>,
) -> String {
    let mut out = name.to_owned();
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        out.push(' ');
        out.push_str(part);
    }
    if let Some(props) = properties {
        props.values().for_each(|v| push_leaves(&mut out, v));
    }
    if out.len() > MAX_SEARCH_TEXT {
        let mut cut = MAX_SEARCH_TEXT;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

fn push_leaves(out: &mut String, value: &Value) {
    if out.len() >= MAX_SEARCH_TEXT {
        return;
    }
    match value {
        Value::String(s) => {
            out.push(' ');
            out.push_str(s);
        }
        Value::Number(n) => {
            let _ = write!(out, " {n}");
        }
        Value::Bool(b) => {
            let _ = write!(out, " {b}");
        }
        Value::Array(items) => items.iter().for_each(|v| push_leaves(out, v)),
        Value::Object(map) => map.values().for_each(|v| push_leaves(out, v)),
        Value::Null => {}
    }
}

/// `text` case folded as SQLite's trigram tokenizer folds it, which every
/// backend's search follows so that a needle finds the same events
/// everywhere. It folds case, not just lower case (final sigma to sigma,
/// the micro sign to mu, long s to s): a character whose upper case lowers
/// to one character becomes that, else one with a lower case of one
/// character becomes that. Checked against SQLite for every cased
/// character of Unicode; the tokenizer's tables are older, so some newer
/// capitals it leaves alone are folded here, which can only let through
/// what its index already found.
pub fn fold_case(text: &str) -> String {
    fn one(mut chars: impl Iterator<Item = char>) -> Option<char> {
        match (chars.next(), chars.next()) {
            (Some(c), None) => Some(c),
            _ => None,
        }
    }
    text.chars()
        .map(|c| {
            let upper_lower = one(c.to_uppercase()).and_then(|u| one(u.to_lowercase()));
            upper_lower.or_else(|| one(c.to_lowercase())).unwrap_or(c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn search_text_joins_name_parts_and_leaves_and_is_capped() {
        let mut e = Event::named("scan");
        // Leaves in key order: n, ok, sku, tags.
        let props = json!({"sku": "A-1", "n": 2, "ok": true, "tags": ["x", {"y": null}]});
        e.properties = props.as_object().cloned();
        assert_eq!(search_text(&e, ["reader", "", "r1"]), "scan reader r1 2 true A-1 x");
        e.properties = json!({"long": "é".repeat(MAX_SEARCH_TEXT)}).as_object().cloned();
        let text = search_text(&e, []);
        assert!(text.len() <= MAX_SEARCH_TEXT && text.ends_with('é'), "{}", text.len());
    }

    #[test]
    fn numbers_and_text_at_a_key() {
        let map = json!({"a": "1.5", "b": 2, "c": "x", "d": [1]});
        let map = map.as_object();
        assert_eq!(number_at(map, "a"), Some(1.5));
        assert_eq!(number_at(map, "c"), None);
        assert_eq!(text_at(map, "b").as_deref(), Some("2"));
        assert_eq!(text_at(map, "d"), None);
        assert_eq!(text_at(None, "a"), None);
    }
}
