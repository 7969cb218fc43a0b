//! The cloud's gateway receivers, driven by hand-made gRPC and QUIC
//! clients: exactly-once commits under redelivery and overlap, fencing, and
//! every kind of bad input (credentials, ranges, garbage frames, oversized
//! and decompression-bomb batches), each refused without storing anything
//! and without disturbing other gateways.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::net::SocketAddr;
use std::sync::Arc;

use opgraph_proto::frame::{self, FrameKind, HEADER_LEN};
use opgraph_proto::{Event, pb};
use opgraph_tests::Cloud;
use serde_json::{Value, json};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

fn event(seq: u64, name: &str) -> pb::Event {
    let mut e = Event::named(name).to_pb(format!("evt_test{seq:020}"), seq);
    e.received_at_ms = Some(1_795_000_000_000);
    e
}

fn batch(gateway: &str, epoch: u64, range: (u64, u64), seqs: &[u64]) -> pb::Batch {
    pb::Batch {
        gateway_id: gateway.into(),
        epoch,
        first_sequence: range.0,
        last_sequence: range.1,
        events: seqs.iter().map(|s| event(*s, "tote.moved")).collect(),
    }
}

fn cert(cloud: &Cloud) -> Vec<u8> {
    std::fs::read(cloud.data_dir.join("receiver-cert.pem")).unwrap()
}

async fn grpc(cloud: &Cloud) -> pb::ingest_client::IngestClient<Channel> {
    let addr = &cloud.process.addrs["grpc"];
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(cert(cloud)))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    pb::ingest_client::IngestClient::new(channel)
        .send_compressed(tonic::codec::CompressionEncoding::Zstd)
}

fn authed<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    request
}

async fn hello(
    client: &mut pb::ingest_client::IngestClient<Channel>,
    key: &str,
    gateway: &str,
) -> pb::HelloResponse {
    hello_with_buffer(client, key, gateway, "buf_one").await
}

async fn hello_with_buffer(
    client: &mut pb::ingest_client::IngestClient<Channel>,
    key: &str,
    gateway: &str,
    buffer: &str,
) -> pb::HelloResponse {
    let request = pb::HelloRequest {
        gateway_id: gateway.into(),
        software_version: "test".into(),
        buffer_id: buffer.into(),
    };
    client.hello(authed(request, key)).await.unwrap().into_inner()
}

/// Sends batches on one Send stream and collects one ack per batch.
async fn send_all(
    client: &mut pb::ingest_client::IngestClient<Channel>,
    key: &str,
    batches: Vec<pb::Batch>,
) -> Vec<pb::Ack> {
    let n = batches.len();
    let stream = tokio_stream::iter(batches);
    let mut acks = client.send(authed(stream, key)).await.unwrap().into_inner();
    let mut out = Vec::new();
    while out.len() < n {
        match acks.message().await.unwrap() {
            Some(ack) => out.push(ack),
            None => break,
        }
    }
    out
}

async fn stored_ids(cloud: &Cloud) -> Vec<String> {
    let mut ids: Vec<String> =
        stored(cloud).await.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids
}

/// The `tote.moved` events stored, newest first.
async fn stored(cloud: &Cloud) -> Vec<Value> {
    let body: Value = cloud
        .http()
        .get(cloud.at("/api/events?limit=1000&event=tote.moved"))
        .bearer_auth(&cloud.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["events"].as_array().unwrap().clone()
}

fn ids(seqs: impl IntoIterator<Item = u64>) -> Vec<String> {
    let mut ids: Vec<String> = seqs.into_iter().map(|s| format!("evt_test{s:020}")).collect();
    ids.sort();
    ids
}

/// Waits for acks sent concurrently, checks that each is OK and returns
/// the highest sequence they acknowledge.
async fn highest_of_all_ok(mut tasks: tokio::task::JoinSet<pb::Ack>) -> u64 {
    let mut top = 0;
    while let Some(ack) = tasks.join_next().await {
        let ack = ack.unwrap();
        assert_eq!(ack.status, OK, "{ack:?}");
        top = top.max(ack.acked_sequence);
    }
    top
}

const OK: i32 = pb::AckStatus::Ok as i32;
const REJECTED: i32 = pb::AckStatus::Rejected as i32;
const RETRY_LATER: i32 = pb::AckStatus::RetryLater as i32;

#[tokio::test]
async fn grpc_commits_exactly_once_under_redelivery_overlap_and_gaps() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let mut client = grpc(&cloud).await;
    let session = hello(&mut client, &cloud.key, "gw-a").await;
    assert_eq!((session.epoch, session.acked_sequence), (1, 0));
    let e = session.epoch;
    let acks = send_all(
        &mut client,
        &cloud.key,
        vec![
            batch("gw-a", e, (1, 3), &[1, 2, 3]),
            batch("gw-a", e, (1, 3), &[1, 2, 3]), // redelivered
            batch("gw-a", e, (2, 5), &[2, 3, 4, 5]), // overlapping
            batch("gw-a", e, (6, 8), &[6, 8]),    // 7 was dropped at the edge
            batch("gw-a", e, (9, 9), &[]),        // a range of drops only
        ],
    )
    .await;
    let acked: Vec<(i32, u64)> = acks.iter().map(|a| (a.status, a.acked_sequence)).collect();
    assert_eq!(acked, vec![(OK, 3), (OK, 3), (OK, 5), (OK, 8), (OK, 9)], "{acks:?}");
    assert_eq!(stored_ids(&cloud).await, ids([1, 2, 3, 4, 5, 6, 8]));

    // A reconnect resumes from the stored prefix and fences the old epoch.
    let again = hello(&mut client, &cloud.key, "gw-a").await;
    assert_eq!((again.epoch, again.acked_sequence), (2, 9));
    let stale = send_all(&mut client, &cloud.key, vec![batch("gw-a", 1, (10, 10), &[10])]).await;
    assert_eq!(stale[0].status, pb::AckStatus::Fenced as i32);
    // A batch that starts past the stored prefix waits, then is refused
    // for later: nothing is stored out of order.
    let early = send_all(&mut client, &cloud.key, vec![batch("gw-a", 2, (12, 12), &[12])]).await;
    assert_eq!(early[0].status, pb::AckStatus::RetryLater as i32);
    assert_eq!(early[0].acked_sequence, 9);
    assert_eq!(stored_ids(&cloud).await.len(), 7);

    // The gateway's buffer was recreated: sequences start over at 1. The
    // ack restarts instead of swallowing the new events; the old ones, if
    // sent again, are still stored once.
    let fresh = hello_with_buffer(&mut client, &cloud.key, "gw-a", "buf_two").await;
    assert_eq!(fresh.acked_sequence, 0);
    let mut renewed = batch("gw-a", fresh.epoch, (1, 2), &[1, 2]);
    renewed.events[0].id = "evt_test00000000000000000501".into();
    let acks = send_all(&mut client, &cloud.key, vec![renewed]).await;
    assert_eq!((acks[0].status, acks[0].acked_sequence), (OK, 2));
    let mut expected = ids([1, 2, 3, 4, 5, 6, 8]);
    expected.push("evt_test00000000000000000501".into());
    expected.sort();
    assert_eq!(stored_ids(&cloud).await, expected);
    // The same buffer reconnecting keeps its ack.
    let resumed = hello_with_buffer(&mut client, &cloud.key, "gw-a", "buf_two").await;
    assert_eq!(resumed.acked_sequence, 2);
}

/// A gateway keeps a window of batches in flight on its stream: the cloud
/// hands each batch that continues the previous one to the store before
/// that one is answered. Answers still come back in stream order, a resend
/// or a refused batch in the middle changes nothing around it, and every
/// event is stored once.
#[tokio::test]
async fn grpc_answers_a_window_of_batches_in_order_and_stores_each_once() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let mut client = grpc(&cloud).await;
    let e = hello(&mut client, &cloud.key, "gw-w").await.epoch;
    let span =
        |first: u64| batch("gw-w", e, (first, first + 9), &Vec::from_iter(first..first + 10));
    let mut batches: Vec<pb::Batch> = (0..40).map(|b| span(b * 10 + 1)).collect();
    batches.push(span(391)); // sent again
    batches.push(span(401));
    batches.push(batch("gw-w", e, (9, 3), &[])); // a range that goes backwards
    batches.push(span(411));
    let acks = send_all(&mut client, &cloud.key, batches).await;
    let got: Vec<(i32, u64)> = acks.iter().map(|a| (a.status, a.acked_sequence)).collect();
    let mut expected: Vec<(i32, u64)> = (1..=40).map(|b| (OK, b * 10)).collect();
    expected.extend([(OK, 400), (OK, 410), (REJECTED, 0), (OK, 420)]);
    assert_eq!(got, expected);
    assert_eq!(stored_ids(&cloud).await, ids(1..=420));
}

/// A recreated buffer starts its sequences again at 1, below the old
/// session's ack. Batches of the new session that overtake each other
/// (here, each on a stream of its own, sent in reverse) must still wait for
/// their predecessors instead of being refused because of the old ack.
#[tokio::test]
async fn grpc_a_recreated_buffer_keeps_its_window_of_batches() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let mut client = grpc(&cloud).await;
    let first = hello_with_buffer(&mut client, &cloud.key, "gw-r", "buf_one").await;
    let sent = send_all(
        &mut client,
        &cloud.key,
        vec![batch("gw-r", first.epoch, (1, 10), &Vec::from_iter(1..=10))],
    )
    .await;
    assert_eq!((sent[0].status, sent[0].acked_sequence), (OK, 10));

    let fresh = hello_with_buffer(&mut client, &cloud.key, "gw-r", "buf_two").await;
    assert_eq!(fresh.acked_sequence, 0);
    let mut tasks = tokio::task::JoinSet::new();
    for i in (0..5u64).rev() {
        let range = (i * 2 + 1, i * 2 + 2);
        let mut b = batch("gw-r", fresh.epoch, range, &[range.0, range.1]);
        for e in &mut b.events {
            e.id = format!("evt_test{:020}", e.sequence + 500);
        }
        let (mut client, key) = (client.clone(), cloud.key.clone());
        tasks.spawn(async move { send_all(&mut client, &key, vec![b]).await.remove(0) });
    }
    assert_eq!(highest_of_all_ok(tasks).await, 10);
    assert_eq!(stored_ids(&cloud).await, ids((1..=10).chain(501..=510)));
}

#[tokio::test]
async fn grpc_refuses_bad_credentials_and_bad_batches() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let mut client = grpc(&cloud).await;
    let request = pb::HelloRequest { gateway_id: "gw-x".into(), ..Default::default() };
    let status =
        client.hello(authed(request.clone(), "og_wrongwrongwrongwrongwrong")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = client.hello(tonic::Request::new(request.clone())).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    // A key without the ingest scope.
    let created: Value = cloud
        .http()
        .post(cloud.at("/api/keys"))
        .bearer_auth(&cloud.key)
        .json(&json!({"scopes": ["read"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reader = created["apiKey"].as_str().unwrap();
    let status = client.hello(authed(request, reader)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);

    let e = hello(&mut client, &cloud.key, "gw-x").await.epoch;
    let mut shuffled = batch("gw-x", e, (1, 3), &[1, 2, 3]);
    shuffled.events.swap(0, 2);
    let mut outside = batch("gw-x", e, (1, 2), &[1, 2]);
    outside.events[1].sequence = 5;
    let mut no_id = batch("gw-x", e, (1, 1), &[1]);
    no_id.events[0].id.clear();
    let bad = vec![
        batch("gw-x", e, (5, 2), &[]), // backwards range
        batch("gw-x", e, (0, 2), &[1, 2]),
        shuffled,
        outside,
        no_id,
        batch("", e, (1, 1), &[1]),
    ];
    let acks = send_all(&mut client, &cloud.key, bad).await;
    assert_eq!(acks.len(), 6);
    for ack in &acks {
        assert_eq!(ack.status, REJECTED, "{ack:?}");
        assert!(!ack.error.is_empty());
    }
    assert!(stored_ids(&cloud).await.is_empty(), "a rejected batch stored something");

    // One invalid envelope is skipped and named; the rest of its batch lands.
    let mut mixed = batch("gw-x", e, (1, 3), &[1, 2, 3]);
    mixed.events[1].event.clear();
    let acks = send_all(&mut client, &cloud.key, vec![mixed]).await;
    assert_eq!((acks[0].status, acks[0].acked_sequence), (OK, 3));
    assert!(acks[0].error.contains("seq 2"), "{}", acks[0].error);
    assert_eq!(stored_ids(&cloud).await, ids([1, 3]));

    // Another gateway was never affected.
    let mut other = grpc(&cloud).await;
    let e2 = hello(&mut other, &cloud.key, "gw-y").await.epoch;
    let mut theirs = batch("gw-y", e2, (1, 1), &[1]);
    theirs.events[0].id = "evt_test00000000000000000100".into();
    let acks = send_all(&mut other, &cloud.key, vec![theirs]).await;
    assert_eq!((acks[0].status, acks[0].acked_sequence), (OK, 1));
    assert_eq!(stored_ids(&cloud).await, ids([1, 3, 100]));

    let metrics = cloud.metrics().await.unwrap();
    assert!(metrics.contains("reason=\"batch_rejected\"} 6"), "{metrics}");
    assert!(metrics.contains("reason=\"invalid_event\"} 1"), "{metrics}");

    // Past the event limit: refused as it arrives, before it is decoded
    // (the codec counts the events in the raw bytes), nothing stored.
    let seqs: Vec<u64> = (4..=10_004).collect();
    let too_many = batch("gw-x", e, (4, 10_004), &seqs);
    let stream = tokio_stream::iter([too_many]);
    let refused = match client.send(authed(stream, &cloud.key)).await {
        Ok(acks) => acks.into_inner().message().await.unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("10001 events"), "{refused:?}");
    assert_eq!(stored_ids(&cloud).await, ids([1, 3, 100]));
}

/// A gateway clock that is decades off does not date its events: a
/// receive time outside the window an event's own timestamp must lie in
/// (10 years back, a day ahead) gives way to the cloud's.
#[tokio::test]
async fn receive_times_outside_the_timestamp_window_give_way_to_the_clouds() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let mut client = grpc(&cloud).await;
    let e = hello(&mut client, &cloud.key, "gw-t").await.epoch;
    let mut sent = batch("gw-t", e, (1, 3), &[1, 2, 3]);
    sent.events[0].received_at_ms = Some(1);
    sent.events[1].received_at_ms = Some(i64::MAX);
    let before = opgraph_tests::now_ms();
    let acks = send_all(&mut client, &cloud.key, vec![sent]).await;
    assert_eq!((acks[0].status, acks[0].acked_sequence), (OK, 3), "{acks:?}");
    let after = opgraph_tests::now_ms();
    let events = stored(&cloud).await;
    let time_of = |seq: u64| {
        let id = format!("evt_test{seq:020}");
        let event = events.iter().find(|e| e["id"] == id.as_str()).unwrap();
        event["timestamp"].as_i64().unwrap()
    };
    for seq in [1, 2] {
        assert!((before..=after).contains(&time_of(seq)), "seq {seq}: {events:?}");
    }
    assert_eq!(time_of(3), 1_795_000_000_000, "a receive time in the window dates its event");
}

/// Sequences past what the stores hold (2^63 - 1) are refused, naming the
/// range, and the stream (or QUIC connection) carries on: the next batch
/// on it is answered.
#[tokio::test]
async fn sequences_past_what_stores_hold_are_refused() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let mut client = grpc(&cloud).await;
    let e = hello(&mut client, &cloud.key, "gw-z").await.epoch;
    let batches = vec![
        batch("gw-z", e, (1, u64::MAX), &[1]),
        batch("gw-z", e, (u64::MAX, u64::MAX), &[u64::MAX]),
        batch("gw-z", e, (1, 1), &[1]),
    ];
    let acks = send_all(&mut client, &cloud.key, batches).await;
    assert_eq!(acks.len(), 3, "{acks:?}");
    for ack in &acks[..2] {
        assert_eq!(ack.status, REJECTED, "{ack:?}");
        assert!(ack.error.contains("sequence"), "{ack:?}");
    }
    assert_eq!((acks[2].status, acks[2].acked_sequence), (OK, 1), "{:?}", acks[2]);
    assert_eq!(stored_ids(&cloud).await, ids([1]));

    // The same on one QUIC connection, a stream per batch.
    let (_endpoint, connection) = quic_connect(&cloud).await;
    let e = quic_session(&connection, &cloud.key, "gw-zq").await.unwrap().epoch;
    let mut mine = batch("gw-zq", e, (1, 1), &[1]);
    mine.events[0].id = "evt_test00000000000000000200".into();
    for bad in [
        batch("gw-zq", e, (1, u64::MAX), &[1]),
        batch("gw-zq", e, (u64::MAX, u64::MAX), &[u64::MAX]),
    ] {
        let ack = quic_send(&connection, &frame::encode_batch(&bad, 1).unwrap()).await;
        assert_eq!(ack.status, REJECTED, "{ack:?}");
        assert!(ack.error.contains("sequence"), "{ack:?}");
    }
    let ack = quic_send(&connection, &frame::encode_batch(&mine, 1).unwrap()).await;
    assert_eq!((ack.status, ack.acked_sequence), (OK, 1), "{ack:?}");
    assert_eq!(stored_ids(&cloud).await, ids([1, 200]));
}

/// A batch that would pass the monthly quota is stored as far as it fits;
/// its invalid events are counted once, those past the stored prefix when
/// they come again.
#[tokio::test]
async fn grpc_stores_the_part_of_a_batch_that_fits_the_quota() {
    let cloud = Cloud::start(&[("OPGRAPH_EVENTS_QUOTA", "2".to_owned())]).await.unwrap();
    let mut client = grpc(&cloud).await;
    let e = hello(&mut client, &cloud.key, "gw-q").await.epoch;
    // Valid: 1, 3 and 4; 2 and 5 are invalid.
    let mut over = batch("gw-q", e, (1, 5), &[1, 2, 3, 4, 5]);
    over.events[1].event.clear();
    over.events[4].event.clear();
    let acks = send_all(&mut client, &cloud.key, vec![over]).await;
    assert_eq!((acks[0].status, acks[0].acked_sequence), (RETRY_LATER, 3), "{:?}", acks[0]);
    assert!(acks[0].error.contains("quota"), "{}", acks[0].error);
    assert_eq!(stored_ids(&cloud).await, ids([1, 3]));
    // The rest, sent again, waits: nothing is left.
    let mut client = grpc(&cloud).await;
    let e = hello(&mut client, &cloud.key, "gw-q").await.epoch;
    let mut rest = batch("gw-q", e, (4, 5), &[4, 5]);
    rest.events[1].event.clear();
    let acks = send_all(&mut client, &cloud.key, vec![rest]).await;
    assert_eq!((acks[0].status, acks[0].acked_sequence), (RETRY_LATER, 0), "{:?}", acks[0]);
    assert_eq!(stored_ids(&cloud).await, ids([1, 3]));
    let metrics = cloud.metrics().await.unwrap();
    assert!(metrics.contains("reason=\"invalid_event\"} 1"), "{metrics}");
    assert!(metrics.contains("reason=\"quota_exceeded\"} 2"), "{metrics}");
}

async fn quic_connect(cloud: &Cloud) -> (quinn::Endpoint, quinn::Connection) {
    let (endpoint, connection) = quic_try_connect(cloud).await;
    (endpoint, connection.unwrap())
}

/// A QUIC connection to the cloud, or why the handshake failed.
async fn quic_try_connect(
    cloud: &Cloud,
) -> (quinn::Endpoint, Result<quinn::Connection, quinn::ConnectionError>) {
    let mut roots = rustls::RootCertStore::empty();
    let pem = cert(cloud);
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut crypto = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    crypto.alpn_protocols = vec![frame::ALPN.to_vec()];
    let config = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(crypto).unwrap(),
    ));
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(config);
    let addr: SocketAddr = cloud.process.addrs["quic"].parse().unwrap();
    let connection = endpoint.connect(addr, "localhost").unwrap().await;
    (endpoint, connection)
}

/// Writes `bytes` on a new stream, finishes it and reads the whole answer.
async fn exchange(
    connection: &quinn::Connection,
    bytes: &[u8],
) -> anyhow::Result<(FrameKind, Vec<u8>)> {
    let (mut send, mut recv) = connection.open_bi().await?;
    send.write_all(bytes).await?;
    send.finish()?;
    let answer = recv.read_to_end(1 << 20).await?;
    let header: [u8; HEADER_LEN] = answer[..HEADER_LEN].try_into()?;
    let (kind, _) = frame::decode_header(header)?;
    Ok((kind, answer[HEADER_LEN..].to_vec()))
}

async fn quic_session(
    connection: &quinn::Connection,
    key: &str,
    gateway: &str,
) -> anyhow::Result<pb::HelloResponse> {
    let open = pb::SessionOpen {
        authorization: format!("Bearer {key}"),
        hello: Some(pb::HelloRequest { gateway_id: gateway.into(), ..Default::default() }),
    };
    let (kind, body) =
        exchange(connection, &frame::encode_message(FrameKind::SessionOpen, &open)).await?;
    assert_eq!(kind, FrameKind::HelloResponse);
    Ok(frame::decode_message(&body)?)
}

async fn quic_send(connection: &quinn::Connection, bytes: &[u8]) -> pb::Ack {
    let (kind, body) = exchange(connection, bytes).await.unwrap();
    assert_eq!(kind, FrameKind::Ack);
    frame::decode_message(&body).unwrap()
}

#[tokio::test]
async fn quic_commits_batches_on_parallel_streams_and_refuses_bad_frames() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let (_endpoint, connection) = quic_connect(&cloud).await;
    let session = quic_session(&connection, &cloud.key, "gw-q").await.unwrap();
    let e = session.epoch;

    // Ten batches in flight at once, in reverse order of sequence: later
    // ones wait for the gap in front of them, none is stored twice.
    let mut tasks = tokio::task::JoinSet::new();
    for i in (0..10u64).rev() {
        let connection = connection.clone();
        let b = batch(
            "gw-q",
            e,
            (i * 10 + 1, i * 10 + 10),
            &(i * 10 + 1..=i * 10 + 10).collect::<Vec<_>>(),
        );
        tasks.spawn(
            async move { quic_send(&connection, &frame::encode_batch(&b, 1).unwrap()).await },
        );
    }
    assert_eq!(highest_of_all_ok(tasks).await, 100);
    assert_eq!(stored_ids(&cloud).await, ids(1..=100));

    // Garbage, a bomb, an oversized declaration, a wrong frame kind.
    let bomb_body = zstd::bulk::compress(&vec![0u8; 100 * 1024 * 1024], 3).unwrap();
    let mut bomb = vec![FrameKind::Batch as u8];
    bomb.extend_from_slice(&(bomb_body.len() as u32).to_be_bytes());
    bomb.extend_from_slice(&bomb_body);
    let mut huge = vec![FrameKind::Batch as u8];
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    let wrong_kind = frame::encode_message(FrameKind::Ack, &pb::Ack::default());
    for bad in [b"\x03\x00\x00\x00\x04junk".to_vec(), bomb, huge, wrong_kind, b"\x07".to_vec()] {
        let ack = quic_send(&connection, &bad).await;
        assert_eq!(ack.status, REJECTED, "{ack:?}");
    }
    // An event bomb: 32 MiB of empty events, 16 million of them, each two
    // bytes on the wire and hundreds in memory once decoded. Counted in
    // the raw bytes and refused; decoded first, they took gigabytes.
    let pid = cloud.process.child.id().unwrap();
    let (before, _) = opgraph_tests::bench::rss_mb(pid);
    let empties = zstd::bulk::compress(&[0x2a, 0x00].repeat(16 << 20), 3).unwrap();
    let mut event_bomb = vec![FrameKind::Batch as u8];
    event_bomb.extend_from_slice(&(empties.len() as u32).to_be_bytes());
    event_bomb.extend_from_slice(&empties);
    let ack = quic_send(&connection, &event_bomb).await;
    assert_eq!(ack.status, REJECTED, "{ack:?}");
    assert!(ack.error.contains("events exceed"), "{ack:?}");
    let (after, _) = opgraph_tests::bench::rss_mb(pid);
    assert!(after - before < 500.0, "RSS grew from {before:.0} MB to {after:.0} MB");
    // The connection still works after all that.
    let ack = quic_send(
        &connection,
        &frame::encode_batch(&batch("gw-q", e, (101, 101), &[101]), 1).unwrap(),
    )
    .await;
    assert_eq!((ack.status, ack.acked_sequence), (OK, 101));
    assert_eq!(stored_ids(&cloud).await.len(), 101);
}

/// More batches than the cloud hands to its store ahead of their answers,
/// all on parallel streams and in a scrambled order: the connection's
/// sequencer holds each until its predecessors went first, and every event
/// is stored once.
#[tokio::test]
async fn quic_sequences_a_scrambled_window_of_batches() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let (_endpoint, connection) = quic_connect(&cloud).await;
    let e = quic_session(&connection, &cloud.key, "gw-s").await.unwrap().epoch;
    let mut tasks = tokio::task::JoinSet::new();
    // 0, 39, 1, 38, ...: every other batch arrives long before its turn.
    let order = (0..20u64).flat_map(|i| [i, 39 - i]);
    for i in order {
        let connection = connection.clone();
        let seqs: Vec<u64> = (i * 10 + 1..=i * 10 + 10).collect();
        let b = batch("gw-s", e, (i * 10 + 1, i * 10 + 10), &seqs);
        tasks.spawn(
            async move { quic_send(&connection, &frame::encode_batch(&b, 1).unwrap()).await },
        );
    }
    assert_eq!(highest_of_all_ok(tasks).await, 400);
    // Sent again, it is acknowledged and stored nothing twice.
    let again = batch("gw-s", e, (391, 400), &(391..=400).collect::<Vec<_>>());
    let ack = quic_send(&connection, &frame::encode_batch(&again, 1).unwrap()).await;
    assert_eq!((ack.status, ack.acked_sequence), (OK, 400));
    assert_eq!(stored_ids(&cloud).await, ids(1..=400));
    // A batch naming a gateway that opened no session here goes past the
    // sequencer, straight to the store, which fences it: nothing stored.
    let stray = batch("gw-elsewhere", e, (401, 402), &[401, 402]);
    let ack = quic_send(&connection, &frame::encode_batch(&stray, 1).unwrap()).await;
    assert_eq!(ack.status, pb::AckStatus::Fenced as i32, "{ack:?}");
    assert_eq!(stored_ids(&cloud).await, ids(1..=400));
}

#[tokio::test]
async fn quic_closes_unauthenticated_connections() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let (_endpoint, connection) = quic_connect(&cloud).await;
    assert!(quic_session(&connection, "og_nottherightkeynottheright", "gw-z").await.is_err());
    let reason = connection.closed().await;
    match reason {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(u64::from(close.error_code), 401)
        }
        other => panic!("expected an application close, got {other:?}"),
    }
    // Nor a SessionOpen past 64 KiB: it is not read further, let alone
    // authenticated.
    let (_endpoint, connection) = quic_connect(&cloud).await;
    assert!(quic_session(&connection, &"k".repeat(100_000), "gw-z").await.is_err());
    match connection.closed().await {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(u64::from(close.error_code), 400)
        }
        other => panic!("expected an application close, got {other:?}"),
    }
    // A batch before any session is not accepted either.
    let (_endpoint, connection) = quic_connect(&cloud).await;
    let bytes = frame::encode_batch(&batch("gw-z", 1, (1, 1), &[1]), 1).unwrap();
    assert!(exchange(&connection, &bytes).await.is_err());
    assert!(stored_ids(&cloud).await.is_empty());
}

/// Connections that have not authenticated yet are bounded: past the bound
/// a new one is refused before its handshake (QUIC's CONNECTION_REFUSED)
/// and counted, while a gateway already in session goes on; once the
/// strangers leave, connections are accepted again.
#[tokio::test]
async fn quic_bounds_connections_that_have_not_authenticated() {
    let limit = ("OPGRAPH_QUIC_MAX_UNAUTHENTICATED", "2".to_owned());
    let cloud = Cloud::start(&[limit]).await.unwrap();
    let refused = |connection: &Result<quinn::Connection, quinn::ConnectionError>| {
        matches!(connection, Err(quinn::ConnectionError::ConnectionClosed(close))
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED)
    };
    // In session before the strangers come: it holds none of the places.
    let (_gateway_endpoint, gateway) = quic_connect(&cloud).await;
    let e = quic_session(&gateway, &cloud.key, "gw-u").await.unwrap().epoch;

    // Two connections that never open a session take both places.
    let mut strangers = Vec::new();
    for _ in 0..2 {
        strangers.push(quic_connect(&cloud).await);
    }
    let (_endpoint, third) = quic_try_connect(&cloud).await;
    assert!(refused(&third), "{third:?}");
    let metrics = cloud.metrics().await.unwrap();
    assert!(metrics.contains("reason=\"quic_unauthenticated_limit\"} 1"), "{metrics}");

    // The gateway in session is not held up.
    let b = batch("gw-u", e, (1, 1), &[1]);
    let ack = quic_send(&gateway, &frame::encode_batch(&b, 1).unwrap()).await;
    assert_eq!((ack.status, ack.acked_sequence), (OK, 1));

    // The strangers leave: their places come back (once the cloud has read
    // their close), and a newcomer can open a session again.
    for (endpoint, connection) in &strangers {
        connection.close(0u32.into(), b"bye");
        endpoint.wait_idle().await;
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let (_endpoint, newcomer) = loop {
        let (endpoint, connection) = quic_try_connect(&cloud).await;
        if refused(&connection) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        }
        break (endpoint, connection.expect("accepted again"));
    };
    quic_session(&newcomer, &cloud.key, "gw-v").await.unwrap();
    assert_eq!(stored_ids(&cloud).await, ids([1]));
}

/// A stranger's place among the unauthenticated lasts one deadline from
/// its arrival, whatever step it dawdles in: one that opens its first
/// stream late and sends nothing is closed when the connection is 10 s
/// old, not 10 s after the stream (when each step had its own timeout).
#[tokio::test]
async fn quic_strangers_get_one_deadline_to_authenticate() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let (_endpoint, stranger) = quic_connect(&cloud).await;
    let connected = std::time::Instant::now();
    // Idle (the scenario, not a wait for anything), then a stream that
    // never carries a SessionOpen.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let (mut send, _recv) = stranger.open_bi().await.unwrap();
    send.write_all(&[0x01]).await.unwrap();
    let closed =
        tokio::time::timeout(std::time::Duration::from_secs(20), stranger.closed()).await.unwrap();
    let after = connected.elapsed();
    assert!(
        matches!(&closed, quinn::ConnectionError::ApplicationClosed(close)
            if close.error_code == 400u32.into()),
        "{closed:?}"
    );
    assert!(after < std::time::Duration::from_secs(13), "closed {after:?} after connecting");
    let metrics = cloud.metrics().await.unwrap();
    assert!(metrics.contains("reason=\"open_timeout\"} 1"), "{metrics}");
}

/// An ingest key, created with the bootstrap key: (key, id).
async fn ingest_key(cloud: &Cloud) -> (String, String) {
    let created: Value = cloud
        .http()
        .post(cloud.at("/api/keys"))
        .bearer_auth(&cloud.key)
        .json(&json!({"name": "gateway", "scopes": ["ingest"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = created["apiKey"].as_str().unwrap().to_owned();
    (key, created["key"]["id"].as_str().unwrap().to_owned())
}

async fn revoke(cloud: &Cloud, id: &str) {
    let response =
        cloud.http().delete(cloud.at(&format!("/api/keys/{id}"))).bearer_auth(&cloud.key).send();
    assert_eq!(response.await.unwrap().status(), reqwest::StatusCode::NO_CONTENT);
}

/// A session outlives many requests: a key revoked while it is open stops
/// working at the next batch, on both receivers (they authenticated once,
/// at the start, and a revoked gateway key went on writing until the
/// gateway reconnected).
#[tokio::test]
async fn a_key_revoked_mid_session_stops_at_the_next_batch() {
    let cloud = Cloud::start(&[]).await.unwrap();

    let (key, id) = ingest_key(&cloud).await;
    let mut client = grpc(&cloud).await;
    let e = hello(&mut client, &key, "gw-r").await.epoch;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut acks = client.send(authed(stream, &key)).await.unwrap().into_inner();
    tx.send(batch("gw-r", e, (1, 1), &[1])).await.unwrap();
    let ack = acks.message().await.unwrap().unwrap();
    assert_eq!((ack.status, ack.acked_sequence), (OK, 1));
    revoke(&cloud, &id).await;
    tx.send(batch("gw-r", e, (2, 2), &[2])).await.unwrap();
    let refused = acks.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert_eq!(stored_ids(&cloud).await, ids([1]));

    let (key, id) = ingest_key(&cloud).await;
    let (_endpoint, connection) = quic_connect(&cloud).await;
    let e = quic_session(&connection, &key, "gw-rq").await.unwrap().epoch;
    let mut first = batch("gw-rq", e, (1, 1), &[1]);
    first.events[0].id = "evt_test00000000000000000010".into();
    let ack = quic_send(&connection, &frame::encode_batch(&first, 1).unwrap()).await;
    assert_eq!((ack.status, ack.acked_sequence), (OK, 1));
    revoke(&cloud, &id).await;
    let mut second = batch("gw-rq", e, (2, 2), &[2]);
    second.events[0].id = "evt_test00000000000000000011".into();
    let sent = exchange(&connection, &frame::encode_batch(&second, 1).unwrap()).await;
    assert!(sent.is_err(), "answered after the revocation: {sent:?}");
    match connection.closed().await {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(u64::from(close.error_code), 401)
        }
        other => panic!("expected an application close, got {other:?}"),
    }
    assert_eq!(stored_ids(&cloud).await, ids([1, 10]));
}
