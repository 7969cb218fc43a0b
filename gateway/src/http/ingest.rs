//! `POST /ingest` (and `/api/ingest`): the cloud's ingest envelope, one
//! event or `{"batch": [...]}` of at most 1000, all or nothing, validated
//! by the same rules as the cloud (`opgraph_proto::envelope`).
//!
//! Each event gets an `evt_` id and the gateway's receive time, is encoded
//! as a protobuf `Event` and appended to the buffer in one append. The 202
//! answer `{"accepted": n, "ids": [...]}` is sent only once that append is
//! durable (per the buffer's fsync policy): a producer that got its 202 can
//! forget the events.
//!
//! A request with an `Idempotency-Key` gets ids derived from the key, the
//! body and each event's position, not new ones: a producer that sends it
//! again (its 202 lost with a timeout, say) gets the same ids, and the
//! cloud, which stores an id once, keeps one copy. This holds across
//! gateway restarts and crashes, with no memory of keys to keep.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use opgraph_proto::Event;
use opgraph_proto::envelope::{BodyError, idempotency_key, parse_body_bytes};
use opgraph_proto::ids::{derived_ids, new_id_at};
use opgraph_proto::serve::BodyReadError;
use prost::Message;
use serde_json::json;

use super::{ApiError, HttpState};
use crate::error::Error;
use crate::source::now_ms;

/// Ids and buffer records for `events` received at `now_ms`; the ids
/// derived from `keyed` (the request's `Idempotency-Key` and body) when
/// given, new otherwise.
pub fn encode_events(
    events: &[Event],
    now_ms: i64,
    keyed: Option<(&str, &[u8])>,
) -> (Vec<String>, Vec<Bytes>) {
    let ids = match keyed {
        Some((key, body)) => derived_ids("evt", &[key.as_bytes(), body], events.len()),
        None => events.iter().map(|_| new_id_at("evt", now_ms)).collect(),
    };
    events
        .iter()
        .zip(ids)
        .map(|(event, id)| {
            let mut message = event.to_pb(id.clone(), 0);
            message.received_at_ms = Some(now_ms);
            (id, Bytes::from(message.encode_to_vec()))
        })
        .unzip()
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim();
            mime.eq_ignore_ascii_case("application/json")
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
}

pub async fn ingest(State(state): State<HttpState>, headers: HeaderMap, body: Body) -> Response {
    match accept(&state, &headers, body).await {
        Ok((accepted, ids)) => {
            (StatusCode::ACCEPTED, axum::Json(json!({ "accepted": accepted, "ids": ids })))
                .into_response()
        }
        Err(e) => {
            state.metrics.ingest_rejected(e.code);
            e.into_response()
        }
    }
}

async fn accept(
    state: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(usize, Vec<String>), ApiError> {
    authorize(&state.ingest_tokens, headers)?;
    if !is_json(headers) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Content-Type must be application/json",
        ));
    }
    let limit = state.body_limit;
    let unread = |e: BodyReadError| ApiError::new(e.status(), e.code(), e.message(limit));
    opgraph_proto::serve::check_declared_length(headers, limit).map_err(unread)?;
    let key = match headers.get("idempotency-key") {
        Some(value) => Some(idempotency_key(value.as_bytes()).map_err(|message| ApiError {
            field: Some("Idempotency-Key".to_owned()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "validation_failed", message)
        })?),
        None => None,
    };
    let bytes = opgraph_proto::serve::read_body(body, limit).await.map_err(unread)?;
    // Parsed events take several times the body's size: only the permit
    // holders build them (a slow producer still sending its body holds no
    // permit), and they are dropped before the possibly long durable
    // append, so that part of memory is bounded by the permits, not by the
    // number of producers.
    let (ids, records) = {
        let _permit = state.ingest_permits.acquire().await.map_err(|_| shutting_down())?;
        let now = now_ms();
        let events = parse_body_bytes(&bytes, now).map_err(|e| match e {
            BodyError::Json(e) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", format!("invalid JSON: {e}"))
            }
            BodyError::Invalid(e) => ApiError {
                field: Some(e.field),
                ..ApiError::new(StatusCode::BAD_REQUEST, "validation_failed", e.message)
            },
        })?;
        encode_events(&events, now, key.map(|key| (key, &bytes[..])))
    };
    drop(bytes);
    state.buffer.append(records).await.map_err(append_error)?;
    state.metrics.events_accepted.inc_by(ids.len() as u64);
    Ok((ids.len(), ids))
}

/// Whether the request's bearer token is one of `tokens` (digests), when
/// there are any. Checked before the body is read: a stranger's body costs
/// nothing.
fn authorize(tokens: &[String], headers: &HeaderMap) -> Result<(), ApiError> {
    if tokens.is_empty() {
        return Ok(());
    }
    let unauthorized = |message| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .ok_or_else(|| unauthorized("a token is required: Authorization: Bearer <token>"))?;
    let digest = opgraph_proto::ids::credential_hash(token);
    // Digests of a secret: comparing them early-exit leaks nothing usable.
    if tokens.contains(&digest) { Ok(()) } else { Err(unauthorized("the token is not accepted")) }
}

fn shutting_down() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the gateway is shutting down")
}

/// A failed append as an answer; internal details are logged, not sent.
fn append_error(e: Error) -> ApiError {
    match e {
        Error::AppendTooLarge { .. } | Error::RecordTooLarge { .. } => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", e.to_string())
        }
        Error::Closed => shutting_down(),
        e if e.retryable() => {
            tracing::warn!(error = %e, "ingest append not durable");
            ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the buffer cannot store events right now; retry later",
                )
            }
        }
        e => {
            tracing::error!(error = %e, "ingest append failed");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::{Future, poll_fn};
    use std::sync::Arc;
    use std::task::Poll;

    use opgraph_proto::pb;
    use tokio::sync::{Semaphore, watch};

    use super::*;
    use crate::buffer::{Buffer, MemoryBuffer};
    use crate::shipper::{SessionState, UplinkStatus};
    use crate::source::SourceSet;
    use crate::telemetry::Metrics;

    fn state(permits: Arc<Semaphore>) -> HttpState {
        let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
        let uplink = UplinkStatus {
            endpoint: "grpc://127.0.0.1:1".into(),
            state: SessionState::Connecting,
            connected: false,
            epoch: 0,
            last_acked_sequence: 0,
            in_flight_batches: 0,
            last_error: None,
            consecutive_failures: 0,
        };
        HttpState {
            gateway_id: Arc::from("g"),
            metrics: Arc::new(Metrics::new(Arc::clone(&buffer))),
            buffer,
            uplink: watch::channel(uplink).1,
            sources: Arc::new(SourceSet::new(Vec::new())),
            body_limit: 1 << 20,
            ingest_permits: permits,
            ingest_tokens: Arc::from([]),
        }
    }

    /// Whether `call` finished in one poll.
    async fn polled<F: Future>(call: &mut std::pin::Pin<&mut F>) -> bool {
        poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_ready())).await
    }

    #[tokio::test]
    async fn bodies_wait_for_a_parsing_permit() {
        let permits = Arc::new(Semaphore::new(1));
        let held = Arc::clone(&permits).acquire_owned().await.unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        // Invalid JSON: without the bound the answer needs no I/O at all,
        // so it would be ready at the first poll.
        let call = ingest(State(state(Arc::clone(&permits))), headers, Body::from("{oops"));
        tokio::pin!(call);
        for _ in 0..10 {
            assert!(!polled(&mut call).await, "parsed without a permit");
            tokio::task::yield_now().await;
        }
        drop(held);
        assert_eq!(call.await.status(), StatusCode::BAD_REQUEST);
        assert_eq!(permits.available_permits(), 1, "the permit is given back");
    }

    #[test]
    fn events_are_encoded_with_ids_and_receive_time() {
        let events = vec![Event::named("a"), Event::named("b")];
        let (ids, records) = encode_events(&events, 1_795_000_000_000, None);
        assert_eq!(ids.len(), 2);
        assert!(ids.iter().all(|id| id.starts_with("evt_") && id.len() == 30), "{ids:?}");
        assert_ne!(ids[0], ids[1]);
        let decoded = pb::Event::decode(records[1].clone()).unwrap();
        assert_eq!(decoded.id, ids[1]);
        assert_eq!(decoded.event, "b");
        assert_eq!(decoded.received_at_ms, Some(1_795_000_000_000));
        assert_eq!(decoded.sequence, 0, "the shipper sets the sequence");
        assert_eq!(Event::from_pb(decoded, 1_795_000_000_000).unwrap(), events[1]);
    }

    #[test]
    fn a_keyed_request_gets_the_same_ids_every_time() {
        let events = vec![Event::named("a"), Event::named("b")];
        let keyed =
            |key: &str, body: &str, at| encode_events(&events, at, Some((key, body.as_bytes()))).0;
        let first = keyed("k-1", "{body}", 1_795_000_000_000);
        assert!(first.iter().all(|id| id.starts_with("evt_") && id.len() == 30), "{first:?}");
        assert_ne!(first[0], first[1]);
        // Sent again later: the same ids.
        assert_eq!(keyed("k-1", "{body}", 1_795_000_009_000), first);
        // Another key, or another body under the key, is another request.
        assert_ne!(keyed("k-2", "{body}", 1_795_000_000_000)[0], first[0]);
        assert_ne!(keyed("k-1", "{other}", 1_795_000_000_000)[0], first[0]);
    }
}
