//! Connecting the NATS tests to the server named by [`VAR`], directly and
//! through a fault-injecting [`Proxy`], and reading a stream back.

use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{Client, ConnectOptions};

use super::proxy::Proxy;
use super::servers;

pub const VAR: &str = "OUTBOX_TEST_NATS_URL";

/// A direct JetStream context for checks, a proxy to the server and a
/// client through the proxy (quick to time out and to reconnect); `None`
/// when [`VAR`] is unset.
pub async fn connect(test: &str) -> Option<(jetstream::Context, Proxy, Client)> {
    let url = servers::url(VAR, test)?;
    let admin = async_nats::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("{VAR}={url} is set but the server does not answer: {e}"));
    let admin = jetstream::new(admin);
    let proxy = Proxy::start(upstream_addr(&url).await).await;
    let client = ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .reconnect_delay_callback(|_| Duration::from_millis(20))
        .connect(format!("nats://{}", proxy.addr()))
        .await
        .expect("connect through the proxy");
    Some((admin, proxy, client))
}

async fn upstream_addr(url: &str) -> SocketAddr {
    let hostport = url
        .split("://")
        .last()
        .unwrap_or(url)
        .split(['/', ','])
        .next()
        .unwrap_or("127.0.0.1:4222");
    let hostport = hostport.rsplit('@').next().unwrap_or(hostport);
    let addr = tokio::net::lookup_host(hostport)
        .await
        .expect("resolve the NATS host")
        .find(|a| a.is_ipv4())
        .expect("an IPv4 address for the NATS host");
    addr
}

/// What `stream` holds: `(subject, payload)` of every message, in stream
/// order.
pub async fn messages(admin: &jetstream::Context, stream: &str) -> Vec<(String, Vec<u8>)> {
    let mut s = admin.get_stream(stream).await.expect("stream");
    let last = s.info().await.expect("stream info").state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = s.get_raw_message(seq).await.expect("message");
        out.push((m.subject.to_string(), m.payload.to_vec()));
    }
    out
}

pub async fn delete_stream(admin: &jetstream::Context, stream: &str) {
    admin
        .delete_stream(stream)
        .await
        .expect("delete the stream");
}
