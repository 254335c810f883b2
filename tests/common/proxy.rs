//! A fault-injecting TCP proxy on loopback: put it between a client and a
//! real server, then cut, stall, delay or black-hole the connection.
//!
//! ```ignore
//! let proxy = Proxy::start(server_addr).await;   // listens on 127.0.0.1:0
//! connect_client_to(proxy.addr());
//! proxy.set_mode(Mode::Stall);                    // nothing moves
//! proxy.cut_all();                                // every open connection closes
//! let cut = proxy.cut_reply_on(b"COMMIT\0");      // cut when the server says it
//! cut.fired().await;
//! ```
//!
//! The mode applies to every connection, open or new, from the next chunk
//! on. Dropping the proxy closes the listener and every connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Accept new connections and close them at once (the server looks
    /// down); open connections are untouched: [`Proxy::cut_all`] them.
    Refuse,
    /// Forward nothing either way; bytes read wait until the mode changes.
    /// New connections are accepted and held.
    Stall,
    /// Forward both ways, each chunk after this delay.
    Delay(Duration),
    /// Forward client to server; discard server to client (replies lost).
    DropReplies,
}

/// Which way a chunk travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    ToServer,
    ToClient,
}

/// The proxy: see the [module docs](self).
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    root: CancellationToken,
    generation: Mutex<CancellationToken>,
    trigger: Mutex<Option<Trigger>>,
    accepted: AtomicUsize,
}

struct Trigger {
    pattern: Vec<u8>,
    fired: oneshot::Sender<()>,
    /// Stall instead of cutting.
    stall: bool,
}

/// An armed [`Proxy::cut_reply_on`].
pub struct CutReply {
    fired: oneshot::Receiver<()>,
}

impl CutReply {
    /// Resolves when the cut happened; panics after `deadline`.
    pub async fn fired(self, deadline: Duration) {
        match tokio::time::timeout(deadline, self.fired).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("the proxy was dropped before the cut"),
            Err(_) => panic!("the reply to cut did not come within {deadline:?}"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Proxy {
    /// A proxy on `127.0.0.1:0` forwarding to `upstream` (a loopback
    /// address), in [`Mode::Pass`].
    pub async fn start(upstream: SocketAddr) -> Proxy {
        assert!(
            upstream.ip().is_loopback(),
            "the proxy only targets loopback"
        );
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind the proxy on loopback");
        let addr = listener.local_addr().expect("proxy address");
        let root = CancellationToken::new();
        let shared = Arc::new(Shared {
            upstream,
            mode: watch::Sender::new(Mode::Pass),
            generation: Mutex::new(root.child_token()),
            root,
            trigger: Mutex::new(None),
            accepted: AtomicUsize::new(0),
        });
        tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy { addr, shared }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the mode for open and new connections.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// Closes every open connection now (both sides see the socket close).
    pub fn cut_all(&self) {
        let next = self.shared.root.child_token();
        let old = std::mem::replace(&mut *lock(&self.shared.generation), next);
        old.cancel();
    }

    /// Arms a one-shot cut: the first server-to-client chunk containing
    /// `pattern` is discarded and its connection closed, so the server has
    /// done the work while the client never hears of it. Replaces an armed
    /// cut that has not fired.
    pub fn cut_reply_on(&self, pattern: &[u8]) -> CutReply {
        assert!(
            !pattern.is_empty() && pattern.len() <= TAIL,
            "pattern of 1..={TAIL} bytes"
        );
        let (tx, rx) = oneshot::channel();
        *lock(&self.shared.trigger) = Some(Trigger {
            pattern: pattern.to_vec(),
            fired: tx,
            stall: false,
        });
        CutReply { fired: rx }
    }

    /// Arms a one-shot stall: the first server-to-client chunk containing
    /// `pattern` is held, and the proxy's mode becomes [`Mode::Stall`], so
    /// the server has done the work while the client waits, as a paused
    /// process would, until the mode changes. Replaces an armed cut.
    pub fn stall_reply_on(&self, pattern: &[u8]) -> CutReply {
        assert!(
            !pattern.is_empty() && pattern.len() <= TAIL,
            "pattern of 1..={TAIL} bytes"
        );
        let (tx, rx) = oneshot::channel();
        *lock(&self.shared.trigger) = Some(Trigger {
            pattern: pattern.to_vec(),
            fired: tx,
            stall: true,
        });
        CutReply { fired: rx }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.root.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.root.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((client, _)) = accepted else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if *shared.mode.borrow() == Mode::Refuse {
            drop(client);
            continue;
        }
        let token = lock(&shared.generation).child_token();
        tokio::spawn(serve(client, shared.clone(), token));
    }
}

async fn serve(client: TcpStream, shared: Arc<Shared>, token: CancellationToken) {
    let server = tokio::select! {
        _ = token.cancelled() => return,
        s = TcpStream::connect(shared.upstream) => match s {
            Ok(s) => s,
            Err(_) => return,
        },
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let up = tokio::spawn(pump(
        client_r,
        server_w,
        Dir::ToServer,
        shared.clone(),
        token.clone(),
    ));
    let down = tokio::spawn(pump(server_r, client_w, Dir::ToClient, shared, token));
    let _ = up.await;
    let _ = down.await;
}

/// Bytes kept from the previous chunk so a pattern split across two
/// chunks is still seen.
const TAIL: usize = 64;

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    dir: Dir,
    shared: Arc<Shared>,
    token: CancellationToken,
) {
    let mut mode_rx = shared.mode.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail: Vec<u8> = Vec::with_capacity(2 * TAIL);
    loop {
        let n = tokio::select! {
            _ = token.cancelled() => return,
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => { token.cancel(); return; }
                Ok(n) => n,
            },
        };
        let chunk = &buf[..n];
        if dir == Dir::ToClient {
            match trips_trigger(&shared, &mut tail, chunk) {
                Some(true) => {
                    shared.mode.send_replace(Mode::Stall);
                }
                Some(false) => {
                    token.cancel();
                    return;
                }
                None => {}
            }
        }
        let forward = loop {
            let mode = *mode_rx.borrow_and_update();
            match mode {
                Mode::Stall => tokio::select! {
                    _ = token.cancelled() => return,
                    r = mode_rx.changed() => if r.is_err() { return },
                },
                Mode::Delay(d) => {
                    tokio::select! {
                        _ = token.cancelled() => return,
                        _ = tokio::time::sleep(d) => {},
                    }
                    break true;
                }
                Mode::DropReplies => break dir == Dir::ToServer,
                Mode::Pass | Mode::Refuse => break true,
            }
        };
        if !forward {
            continue;
        }
        let written = tokio::select! {
            _ = token.cancelled() => return,
            w = to.write_all(chunk) => w,
        };
        if written.is_err() {
            token.cancel();
            return;
        }
    }
}

/// Whether `chunk` (after the previous chunk's `tail`) holds the armed
/// pattern; if so the trigger fires and is disarmed, and the answer says
/// whether it stalls (`Some(true)`) or cuts (`Some(false)`).
fn trips_trigger(shared: &Shared, tail: &mut Vec<u8>, chunk: &[u8]) -> Option<bool> {
    let mut trigger = lock(&shared.trigger);
    let hit = trigger.as_ref().is_some_and(|t| {
        // Only matches that end inside the new chunk: the tail alone may
        // hold an old match from before the trigger was armed.
        let keep = tail.len().min(t.pattern.len() - 1);
        let mut window = tail[tail.len() - keep..].to_vec();
        window.extend_from_slice(chunk);
        window
            .windows(t.pattern.len())
            .any(|w| w == t.pattern.as_slice())
    });
    tail.extend_from_slice(chunk);
    if tail.len() > TAIL {
        tail.drain(..tail.len() - TAIL);
    }
    if !hit {
        return None;
    }
    let t = trigger.take()?;
    let _ = t.fired.send(());
    Some(t.stall)
}
