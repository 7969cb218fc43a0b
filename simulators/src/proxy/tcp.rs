//! TCP through the flaky link.
//!
//! One task per accepted connection dials the upstream, then runs one pump
//! per direction. A pump is a reader and a writer joined by a bounded
//! channel of `tcp_buffer_chunks`: the reader plans each chunk with the link
//! model (release time, simulated retransmissions), the writer sleeps until
//! that time and writes. When the channel is full the reader stops reading,
//! so the sender feels back-pressure as it would from a slow link.
//!
//! A partition stalls writers until it heals (`stall`), or resets both ends
//! of every connection (`reset`). An I/O error on one side resets the other
//! side too, as the far end of a real broken path would see it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::{Duration, Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span, warn};

use super::link::{Direction, StreamOrder};
use super::stats::add;
use super::{PartitionMode, PartitionState, Shared};

/// Accepts connections until cancelled.
pub(super) async fn run(
    listener: TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, peer)) => {
                add(&shared.counters.connections, 1);
                let span = info_span!("tcp_connection", %peer);
                let conn =
                    connection(client, shared.clone(), cancel.child_token(), tracker.clone());
                tracker.spawn(conn.instrument(span));
            }
            Err(e) => {
                // Usually out of file descriptors: wait rather than spin.
                warn!(error = %e, "accept failed");
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
}

/// What both pumps of one connection share.
struct Conn {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    /// Close with RST rather than FIN.
    reset: AtomicBool,
}

impl Conn {
    fn abort(&self) {
        self.reset.store(true, Ordering::Relaxed);
        self.cancel.cancel();
    }
}

async fn connection(
    client: TcpStream,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let mut partition = shared.partition_rx();
    let PartitionState { partitioned, epoch } = *partition.borrow_and_update();
    if partitioned {
        match shared.config.partition_mode {
            PartitionMode::Reset => {
                add(&shared.counters.connections_refused, 1);
                return refuse(client);
            }
            PartitionMode::Stall => {
                debug!("held until the partition heals");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    healed = partition.wait_for(|s| !s.partitioned) => if healed.is_err() { return },
                }
            }
        }
    }
    let upstream = shared.config.upstream;
    let dialled = tokio::select! {
        () = cancel.cancelled() => return,
        dialled = timeout(shared.config.connect_timeout, TcpStream::connect(upstream)) => dialled,
    };
    let upstream_stream = match dialled {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return connect_failed(&shared, client, upstream, &e.to_string()),
        Err(_) => return connect_failed(&shared, client, upstream, "timed out"),
    };
    for stream in [&client, &upstream_stream] {
        // The link model decides the delays; Nagle must not add its own.
        if let Err(e) = stream.set_nodelay(true) {
            debug!(error = %e, "set_nodelay failed");
        }
    }
    let conn = Arc::new(Conn { shared: shared.clone(), cancel, reset: AtomicBool::new(false) });
    let (client_rd, client_wr) = client.into_split();
    let (upstream_rd, upstream_wr) = upstream_stream.into_split();
    let to_upstream = pump(client_rd, upstream_wr, Direction::ToUpstream, conn.clone());
    let to_client = pump(upstream_rd, client_wr, Direction::ToClient, conn.clone());
    let to_upstream = tracker.spawn(to_upstream.in_current_span());
    let to_client = tracker.spawn(to_client.in_current_span());
    let pumps = async {
        let _ = tokio::join!(to_upstream, to_client);
    };
    tokio::pin!(pumps);
    let partition_resets = async {
        if shared.config.partition_mode == PartitionMode::Reset {
            let _ = partition.wait_for(|s| s.epoch != epoch).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = &mut pumps => {}
        () = partition_resets => {
            debug!("reset by a partition");
            add(&shared.counters.connections_reset, 1);
            conn.abort();
            pumps.await;
        }
    }
}

fn connect_failed(shared: &Shared, client: TcpStream, upstream: SocketAddr, why: &str) {
    warn!(%upstream, why, "cannot reach the upstream; resetting the client");
    add(&shared.counters.connections_refused, 1);
    refuse(client);
}

/// Closes with RST, like a refused connection.
fn refuse(client: TcpStream) {
    if let Err(e) = client.set_zero_linger() {
        debug!(error = %e, "set_zero_linger failed");
    }
}

enum Item {
    Data { at: Instant, bytes: Vec<u8> },
    Fin { at: Instant },
}

async fn pump(rd: OwnedReadHalf, wr: OwnedWriteHalf, direction: Direction, conn: Arc<Conn>) {
    let (tx, rx) = mpsc::channel(conn.shared.config.tcp_buffer_chunks);
    // Abort at once, so that the other half of this pump closes with RST.
    let abort_on_error = |result: io::Result<()>| {
        if let Err(e) = result {
            debug!(direction = direction.as_str(), error = %e, "connection broken; resetting");
            conn.abort();
        }
    };
    let read = async { abort_on_error(read_side(rd, tx, direction, &conn).await) };
    let write = async { abort_on_error(write_side(wr, rx, direction, &conn).await) };
    tokio::join!(read, write);
}

async fn read_side(
    mut rd: OwnedReadHalf,
    tx: mpsc::Sender<Item>,
    direction: Direction,
    conn: &Conn,
) -> io::Result<()> {
    let shared = &conn.shared;
    let counters = shared.counters.direction(direction);
    let chunk = usize::try_from(shared.config.tcp_chunk.as_u64()).unwrap_or(usize::MAX);
    let mut order = StreamOrder::default();
    loop {
        let mut bytes = vec![0; chunk];
        let n = tokio::select! {
            () = conn.cancel.cancelled() => return Ok(()),
            n = rd.read(&mut bytes) => n?,
        };
        let item = if n == 0 {
            let at = shared.link(direction).fin(shared.now(), &mut order);
            Item::Fin { at: shared.start + at }
        } else {
            bytes.truncate(n);
            counters.received(n);
            let plan = shared.link(direction).chunk(shared.now(), n, &mut order);
            add(&counters.retransmits, u64::from(plan.losses));
            Item::Data { at: shared.start + plan.at, bytes }
        };
        let fin = matches!(item, Item::Fin { .. });
        tokio::select! {
            () = conn.cancel.cancelled() => return Ok(()),
            sent = tx.send(item) => if sent.is_err() { return Ok(()) },
        }
        if fin {
            return Ok(());
        }
    }
}

async fn write_side(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Item>,
    direction: Direction,
    conn: &Conn,
) -> io::Result<()> {
    let shared = &conn.shared;
    let counters = shared.counters.direction(direction);
    let mut partition = shared.partition_rx();
    let result = async {
        loop {
            let item = tokio::select! {
                () = conn.cancel.cancelled() => return Ok(()),
                item = rx.recv() => item,
            };
            match item {
                None => return Ok(()),
                Some(Item::Fin { at }) => {
                    if release(at, &mut partition, direction, conn, false).await {
                        wr.shutdown().await?;
                    }
                    return Ok(());
                }
                Some(Item::Data { at, bytes }) => {
                    if !release(at, &mut partition, direction, conn, true).await {
                        return Ok(());
                    }
                    tokio::select! {
                        () = conn.cancel.cancelled() => return Ok(()),
                        written = wr.write_all(&bytes) => written?,
                    }
                    counters.delivered(bytes.len());
                }
            }
        }
    }
    .await;
    if conn.reset.load(Ordering::Relaxed) || result.is_err() {
        // RST once the read half (held by the other pump) is dropped too.
        if let Err(e) = wr.as_ref().set_zero_linger() {
            debug!(error = %e, "set_zero_linger failed");
        }
        wr.forget();
    }
    result
}

/// Waits until `at` and until the link is not partitioned. After a
/// partition the chunk waits one more latency (it was stuck at the sender).
/// Returns `false` if the connection was cancelled meanwhile.
async fn release(
    mut at: Instant,
    partition: &mut watch::Receiver<PartitionState>,
    direction: Direction,
    conn: &Conn,
    count_stall: bool,
) -> bool {
    let mut stalled = false;
    loop {
        if partition.borrow_and_update().partitioned {
            if !stalled && count_stall {
                add(&conn.shared.counters.direction(direction).stalled, 1);
            }
            stalled = true;
            tokio::select! {
                () = conn.cancel.cancelled() => return false,
                healed = partition.wait_for(|s| !s.partitioned) => if healed.is_err() { return false },
            }
            let latency = conn.shared.link(direction).config().latency;
            at = at.max(Instant::now() + latency);
            continue;
        }
        tokio::select! {
            () = conn.cancel.cancelled() => return false,
            () = sleep_until(at) => return true,
            changed = partition.changed() => if changed.is_err() { return false },
        }
    }
}
