//! Fault tests of the NATS JetStream sink against a real server, through a
//! fault-injecting proxy. Needs `OUTBOX_TEST_NATS_URL` (skipped when unset,
//! failing when set and unreachable).
#![cfg(feature = "nats")]

mod common;

use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, stream};
use async_nats::Client;
use common::nats;
use common::proxy::{Mode, Proxy};
use common::servers::{self, eventually};
use common::sink::{items, retryable, terminal};
use outbox::sinks::nats::NatsSink;
use outbox::sinks::Envelope;
use outbox::{Sink, Slice, TenantId, Written};

const DEADLINE: Duration = Duration::from_secs(10);
const ACK_TIMEOUT: Duration = Duration::from_millis(500);
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// One test's world: a direct client for checks, a proxy to the server, a
/// sink whose client goes through the proxy, and the test's own stream.
struct Nats {
    admin: jetstream::Context,
    proxy: Proxy,
    client: Client,
    sink: NatsSink<Envelope>,
    stream: String,
}

async fn setup(test: &str) -> Option<Nats> {
    let (admin, proxy, client) = nats::connect(test).await?;
    let stream = servers::unique_name(test);
    let sink = NatsSink::new(client.clone(), &stream)
        .expect("valid prefix")
        .ack_timeout(ACK_TIMEOUT);
    sink.create_stream(&stream, DUPLICATE_WINDOW)
        .await
        .expect("create the stream");
    Some(Nats {
        admin,
        proxy,
        client,
        sink,
        stream,
    })
}

/// What the stream holds: `(subject, payload)` in stream order. Payloads
/// are unique per item, so this shows each copy. (The `Nats-Msg-Id` header
/// is not compared: this client does not decode the headers of a stored
/// message from a 2.9 server; that the ids work shows in the absorbed
/// repeats.)
type Stored = Vec<(String, Vec<u8>)>;

impl Nats {
    async fn stored(&self) -> Stored {
        nats::messages(&self.admin, &self.stream).await
    }

    async fn count(&self) -> u64 {
        let mut s = self.admin.get_stream(&self.stream).await.expect("stream");
        s.info().await.expect("stream info").state.messages
    }

    async fn wait_connected(&self) {
        let client = self.client.clone();
        eventually("the client to reconnect", DEADLINE, || {
            let state = client.connection_state();
            async move { (state == State::Connected).then_some(()) }
        })
        .await;
    }

    async fn delete(&self) {
        nats::delete_stream(&self.admin, &self.stream).await;
    }
}

fn expected(sink: &NatsSink<Envelope>, tenant: TenantId, items: &[Envelope]) -> Stored {
    items
        .iter()
        .map(|e| (sink.subject(&tenant).unwrap(), e.payload.clone()))
        .collect()
}

/// Writes with retries, as the driver would (S-W5, S-W7).
async fn write_retrying(sink: &NatsSink<Envelope>, tenant: TenantId, slice: &[Envelope]) {
    common::sink::write_retrying(sink, &tenant, slice, 6).await;
}

// S-W5, I1: the server stores every message but the acks are lost; the
// retry of the identical slice is absorbed by the message ids.
#[tokio::test]
async fn retry_after_lost_acks_leaves_one_copy() {
    let Some(n) = setup("nats_lost_acks").await else {
        return;
    };
    let tenant = TenantId::new_v7();
    let slice = items("a", 10);

    n.proxy.set_mode(Mode::DropReplies);
    let e = retryable(n.sink.write(&tenant, &slice).await);
    eprintln!("acks lost: {e}");
    eventually("the first attempt to be stored", DEADLINE, || async {
        (n.count().await == 10).then_some(())
    })
    .await;

    n.proxy.set_mode(Mode::Pass);
    n.proxy.cut_all();
    n.wait_connected().await;
    write_retrying(&n.sink, tenant, &slice).await;
    assert_eq!(n.stored().await, expected(&n.sink, tenant, &slice));
    n.delete().await;
}

// S-W3: per tenant, messages follow staging order, with pipelined
// publishes, several writes, and repeats absorbed.
#[tokio::test]
async fn order_per_tenant_holds_with_pipelined_publishes() {
    let Some(mut n) = setup("nats_order").await else {
        return;
    };
    n.sink = n.sink.max_in_flight(4);
    let (t1, t2) = (TenantId::new_v7(), TenantId::new_v7());
    let (mut want1, mut want2) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let s1 = items(&format!("t1-r{round}"), 20);
        let s2 = items(&format!("t2-r{round}"), 20);
        n.sink.write(&t1, &s1).await.unwrap();
        n.sink.write(&t2, &s2).await.unwrap();
        n.sink.write(&t1, &s1).await.unwrap();
        want1.extend(expected(&n.sink, t1, &s1));
        want2.extend(expected(&n.sink, t2, &s2));
    }
    assert_eq!(n.sink.write(&t1, &[]).await.unwrap(), Written::ALL);

    let stored = n.stored().await;
    assert_eq!(stored.len(), 120, "one copy of each");
    let of = |t: TenantId| -> Stored {
        let subject = n.sink.subject(&t).unwrap();
        stored.iter().filter(|m| m.0 == subject).cloned().collect()
    };
    assert_eq!(of(t1), want1);
    assert_eq!(of(t2), want2);
    n.delete().await;
}

// S-A5, S-W7: during an outage (refused, then stalled connections) a write
// fails retryably; once the server is back its retry succeeds, once, and
// a later write follows it.
#[tokio::test]
async fn a_write_during_an_outage_fails_retryably_and_a_later_one_succeeds() {
    let Some(n) = setup("nats_outage").await else {
        return;
    };
    let tenant = TenantId::new_v7();
    let first = items("down", 5);
    let second = items("stalled", 5);
    let third = items("up", 5);

    n.proxy.set_mode(Mode::Refuse);
    n.proxy.cut_all();
    let e = retryable(n.sink.write(&tenant, &first).await);
    eprintln!("refused: {e}");

    n.proxy.set_mode(Mode::Pass);
    n.wait_connected().await;
    write_retrying(&n.sink, tenant, &first).await;

    n.proxy.set_mode(Mode::Stall);
    let e = retryable(n.sink.write(&tenant, &second).await);
    eprintln!("stalled: {e}");
    n.proxy.set_mode(Mode::Pass);
    write_retrying(&n.sink, tenant, &second).await;

    n.proxy.set_mode(Mode::Delay(Duration::from_millis(10)));
    write_retrying(&n.sink, tenant, &third).await;

    let mut want = expected(&n.sink, tenant, &first);
    want.extend(expected(&n.sink, tenant, &second));
    want.extend(expected(&n.sink, tenant, &third));
    assert_eq!(n.stored().await, want);
    n.delete().await;
}

// S-A5: a message the stream can never take is terminal; a missing stream
// (an operator creates it) is retryable.
#[tokio::test]
async fn oversized_messages_are_terminal_and_a_missing_stream_retryable() {
    let Some(n) = setup("nats_terminal").await else {
        return;
    };
    let tenant = TenantId::new_v7();

    // Over the server's max_payload: refused before anything is published.
    let max = n.client.server_info().max_payload;
    let huge = vec![Envelope::new(vec![b'x'; max + 1])];
    let e = terminal(n.sink.write(&tenant, &huge).await);
    assert!(e.to_string().contains("max_payload"), "{e}");

    // Over the stream's max_message_size: JetStream error 10054.
    let small = format!("{}_small", n.stream);
    let small_sink = NatsSink::<Envelope>::new(n.client.clone(), &small)
        .unwrap()
        .ack_timeout(ACK_TIMEOUT);
    n.admin
        .create_stream(stream::Config {
            name: small.clone(),
            subjects: vec![small_sink.subject_filter()],
            max_message_size: 64,
            duplicate_window: DUPLICATE_WINDOW,
            ..stream::Config::default()
        })
        .await
        .expect("create the small stream");
    let e = terminal(
        small_sink
            .write(&tenant, &[Envelope::new(vec![b'y'; 200])])
            .await,
    );
    eprintln!("too large for the stream: {e}");
    n.admin.delete_stream(&small).await.expect("delete");

    // No stream captures the subject: no responders, retryable.
    let nowhere = NatsSink::<Envelope>::new(n.client.clone(), &format!("{}_none", n.stream))
        .unwrap()
        .ack_timeout(ACK_TIMEOUT);
    let e = retryable(nowhere.write(&tenant, &items("x", 1)).await);
    eprintln!("no stream: {e}");

    assert_eq!(n.count().await, 0);
    n.delete().await;
}

/// Writes two slices for `tenant` through a sink keyed by `K` on the
/// test's stream, the first twice (the repeat absorbed by the message
/// ids), and checks the stream holds one copy of each on `subject`.
async fn round_trip<K: outbox::sinks::nats::NatsTenant>(n: &Nats, tenant: K, subject: &str) {
    let sink = NatsSink::<Envelope, K>::new(n.client.clone(), &n.stream)
        .expect("valid prefix")
        .ack_timeout(ACK_TIMEOUT);
    assert_eq!(sink.subject(&tenant).unwrap(), subject);
    let (first, second) = (items("k1", 3), items("k2", 2));
    for slice in [&first, &first, &second] {
        assert_eq!(sink.write(&tenant, slice).await.unwrap(), Written::ALL);
    }
    let want: Stored = first
        .iter()
        .chain(&second)
        .map(|e| (subject.to_owned(), e.payload.clone()))
        .collect();
    assert_eq!(n.stored().await, want, "one copy of each, in order");
}

// The tenant key is the user's type: each maps to its subject token.
#[tokio::test]
async fn u64_keys_publish_to_their_decimal_subject() {
    let Some(n) = setup("nats_key_u64").await else {
        return;
    };
    let subject = format!("{}.18446744073709551615", n.stream);
    round_trip(&n, u64::MAX, &subject).await;
    n.delete().await;
}

#[tokio::test]
async fn i64_keys_publish_to_their_decimal_subject() {
    let Some(n) = setup("nats_key_i64").await else {
        return;
    };
    let subject = format!("{}.-42", n.stream);
    round_trip(&n, -42i64, &subject).await;
    n.delete().await;
}

#[tokio::test]
async fn string_keys_publish_to_their_own_subject() {
    let Some(n) = setup("nats_key_string").await else {
        return;
    };
    let subject = format!("{}.acme-eu_1", n.stream);
    round_trip(&n, "acme-eu_1".to_owned(), &subject).await;
    n.delete().await;
}

#[tokio::test]
async fn uuid_keys_publish_to_their_hyphenated_subject() {
    let Some(n) = setup("nats_key_uuid").await else {
        return;
    };
    let id = uuid::Uuid::from_u128(0x0192_3456_789a_7bcd_8ef0_1234_5678_9abc);
    let subject = format!("{}.01923456-789a-7bcd-8ef0-123456789abc", n.stream);
    round_trip(&n, id, &subject).await;
    n.delete().await;
}

// A token is any text without `.`, `*`, `>`, whitespace or control
// characters: non-ASCII text and a `:` (the message id's separator) are
// valid tokens and must publish, into the subject and the `Nats-Msg-Id`
// header alike, not fail (a retryable failure would retry forever).
#[tokio::test]
async fn string_keys_with_non_ascii_text_or_a_colon_publish_to_their_own_subject() {
    let Some(n) = setup("nats_key_utf8").await else {
        return;
    };
    let subject = format!("{}.zürich:eu-ü", n.stream);
    round_trip(&n, "zürich:eu-ü".to_owned(), &subject).await;
    n.delete().await;
}

// A string key that is not a subject token is refused terminally before
// anything is published: never encoded, never a panic.
#[tokio::test]
async fn a_string_key_that_is_not_a_token_is_terminal_and_publishes_nothing() {
    let Some(n) = setup("nats_key_bad").await else {
        return;
    };
    let sink = NatsSink::<Envelope, String>::new(n.client.clone(), &n.stream)
        .expect("valid prefix")
        .ack_timeout(ACK_TIMEOUT);
    for bad in ["", "acme.eu", "a*", ">", "a b"] {
        let e = terminal(sink.write(&bad.to_owned(), &items("bad", 2)).await);
        assert!(e.to_string().contains("subject token"), "{e}");
    }
    assert_eq!(n.count().await, 0);
    n.delete().await;
}

#[tokio::test]
async fn a_group_is_published_in_one_go_and_a_bad_slice_fails_alone() {
    // S-F1: a group's slices are published in one pipeline, each tenant's
    // messages in its slice's order; a repeat is absorbed by the message
    // ids. S-F3: an oversized slice is rejected alone.
    let Some(n) = setup("nats_group").await else {
        return;
    };
    let (a, b) = (TenantId::new_v7(), TenantId::new_v7());
    let group = vec![Slice::new(a, items("a", 3)), Slice::new(b, items("b", 2))];
    for _ in 0..2 {
        let outcomes = n.sink.write_group(&group).await;
        assert_eq!(outcomes.len(), 2);
        assert!(outcomes.iter().all(|o| matches!(o, Ok(Written::ALL))));
    }
    let mut want = expected(&n.sink, a, &group[0].items);
    want.extend(expected(&n.sink, b, &group[1].items));
    assert_eq!(n.stored().await, want);

    let max = n.client.server_info().max_payload;
    let c = TenantId::new_v7();
    let bad = vec![
        Slice::new(c, vec![Envelope::new(vec![b'x'; max + 1])]),
        Slice::new(a, items("a2", 1)),
    ];
    let mut outcomes = n.sink.write_group(&bad).await.into_iter();
    let e = terminal(outcomes.next().expect("two outcomes"));
    assert!(e.to_string().contains("max_payload"), "{e}");
    assert!(matches!(outcomes.next(), Some(Ok(Written::ALL))));
    assert_eq!(n.count().await, 6);
    n.delete().await;
}
