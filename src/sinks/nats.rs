//! A NATS JetStream sink (feature `nats`): each item is published to the
//! tenant's subject with a message id derived from (tenant, item id), so the
//! stream's duplicate window absorbs repeats.
//!
//! # Subjects, ids, the stream
//! - Subject: `{prefix}.{tenant}`, the tenant as its subject token (see
//!   [`NatsTenant`]: a [`TenantId`] or [`Uuid`] as a hyphenated UUID, e.g.
//!   `usage.0190c4e5-…`; an integer in decimal, `usage.42`; a string as
//!   itself, `usage.acme`); `prefix` is one or more dot-separated tokens.
//! - Message id (header `Nats-Msg-Id`): `{tenant}:{item_id}`, the tenant's
//!   token and the item's hyphenated UUID ([`message_id`]); the UUID has a
//!   fixed length, so a `:` in a string key cannot make two ids one.
//!   JetStream drops a message whose id
//!   it saw within the stream's `duplicate_window` (2 minutes by default)
//!   and acknowledges it as a duplicate, so a repeated write leaves one
//!   copy as long as the retry comes within the window *of the first
//!   publish*. A slice that was partly stored and then keeps failing (the
//!   stream full, say) is retried for as long as the outbox retries it,
//!   which is forever by default: a retry after the window stores the
//!   already stored items again. **Bound the retries below the window**:
//!   set the outbox's `max_retry_duration` (S-B2) to the window minus the
//!   longest write (`write_timeout`) and `max_backoff`, e.g. a 10-minute
//!   window with `max_retry_duration` of 8 minutes; a slice failing for
//!   longer is then counted lost under `retries_exhausted` (part of it may
//!   be stored), never duplicated. A `max_backoff` below the window alone
//!   does not suffice.
//! - Body: the [payload](Record::payload), as is.
//! - A tenant whose token is not a valid subject token (empty, or holding
//!   `.`, `*`, `>`, whitespace or a control character, e.g. the string
//!   `"acme.eu"`) is **rejected, not encoded**: the write fails as
//!   terminal with an [`InvalidTenant`] cause before anything is
//!   published, and its items are counted lost under `terminal`. Encoding
//!   would hide the tenant from subject filters and invite two keys onto
//!   one subject; check string keys where they are minted with
//!   [`NatsTenant::token`], or map them to valid tokens first.
//! - The stream must capture `{prefix}.*`: [`NatsSink::create_stream`]
//!   creates one (file storage, the duplicate window you give).
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use outbox::sinks::{nats::NatsSink, Envelope};
//! use outbox::Sink;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! // Tenants keyed by a slug: subjects `usage.acme`, `usage.globex`, ...
//! let sink = NatsSink::<Envelope, String>::new(client, "usage")?
//!     .ack_timeout(Duration::from_secs(2));
//! sink.create_stream("USAGE", Duration::from_secs(10 * 60)).await?;
//! sink.write(&"acme".to_owned(), &[Envelope::new(b"{\"units\":3}".to_vec())]).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # A write
//! [`Sink::write`] publishes the slice in order on one connection, up to
//! [`max_in_flight`](NatsSink::max_in_flight) publishes ahead of their
//! acks, then awaits every ack, in order, each within the
//! [ack timeout](NatsSink::ack_timeout); it succeeds only when every item
//! is acknowledged as stored (or as a duplicate of a stored copy). The
//! first failed ack fails the write at once (the rest are not awaited), and
//! the retry republishes the whole slice, whose stored part is absorbed.
//! An empty slice publishes nothing.
//!
//! # Fan-in
//! With [`max_slices_per_write`](crate::ConfigBuilder::max_slices_per_write)
//! above 1, [`Sink::write_group`] publishes the messages of every slice of
//! the group (at most `max_in_flight` awaiting their acks at once, across
//! the group), then awaits the acks: one pipeline for many tenants (S-F1).
//! Each slice's outcome comes from its own publishes and acks (S-F3): a
//! slice whose tenant has no subject token or whose payload is too large
//! is rejected alone, and a failed ack fails only its slice.
//!
//! # Order
//! Items of a tenant are stored in staging order (S-W3), with one caveat
//! that comes with pipelining: `async-nats` resends queued publishes on its
//! next connection, so if the connection drops in the middle of a write a
//! later item can be stored while an earlier one was lost with the old
//! connection; the retry then stores the earlier one after it. The sink
//! sees this in the acks' stream sequences and logs it (`tracing` error,
//! "stored out of order"); the items are all there, once. With
//! `max_in_flight(1)` an item is only sent after the previous one is
//! acknowledged, which rules this out at the cost of one round trip per
//! item.
//!
//! # Many instances on one outbox table (leases, epochs)
//! JetStream has no transaction to check an epoch in, so this sink keeps
//! the default [`Sink::write_with_epoch`]: it publishes whatever epoch the
//! write carries (S-L27, S-E8). What that means for a zombie (an instance
//! paused or cut off past its lease that still publishes a write it had
//! started):
//!
//! - A zombie's publish that reaches the stream **within the duplicate
//!   window** of the same item's first publish carries the same
//!   `Nats-Msg-Id` and is absorbed: one copy, and the tenant's order holds
//!   (the copy kept is the first, in its place).
//! - A zombie's publish that reaches the stream **after the window** is
//!   stored again, as a new message **after the newer messages** the new
//!   owner published meanwhile: a repeat, out of order. Keep
//!   `lease_ttl` plus the longest pause you tolerate well under the
//!   window; nothing bounds a pause (S-L9), so the window only makes the
//!   case rare.
//! - A zombie's publish of an item the new owner then dead-letters is
//!   stored: nothing can refuse it here (S-L26).
//!
//! `Nats-Expected-Last-Subject-Sequence` could serve as an epoch check
//! for a stream with one subject per tenant (this sink's layout): see
//! `docs/leases.md`, "Epochs at sinks", for its evaluation and cost (a
//! tenant's publishes are no longer pipelined). It is not adopted.
//!
//! # Errors
//! | cause | kind |
//! | --- | --- |
//! | an ack not received within the ack timeout; a broken connection; the client's queue full or closed | retryable |
//! | no stream for the subject (`no responders`: the stream is missing or restarting) | retryable |
//! | any JetStream error other than those below (storage full, store failed, …) | retryable |
//! | JetStream `10054` (message exceeds the stream's maximum size) | terminal |
//! | a payload larger than the server's `max_payload` (less 1 KiB for headers), checked before publishing anything | terminal |
//!
//! A terminal error may leave a prefix of the slice stored (JetStream has
//! no transaction across messages): those items are in the stream once;
//! the slice is counted lost (S-A5) as a whole.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use async_nats::jetstream::context::{
    CreateStreamError, PublishAckFuture, PublishError, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType};
use async_nats::jetstream::{self, Context, ErrorCode};
use async_nats::Client;

/// The client crate this sink is built on, re-exported so the versions match.
pub use async_nats;
use bytes::Bytes;
use uuid::Uuid;

use crate::sink::{ErrorKind, Sink, Slice, WriteError, Written};
use crate::sinks::{InvalidTenant, Record};
use crate::tenant::{TenantId, TenantKey};

/// Default [`NatsSink::ack_timeout`]: 5 s.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Default [`NatsSink::max_in_flight`]: 256 publishes ahead of their acks.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// Room kept for the headers when checking a payload against the server's
/// `max_payload`, in bytes.
const HEADER_ALLOWANCE: usize = 1024;

/// A tenant key the NATS sink can publish: its text (`Display`) is the
/// subject token and the first half of the message id. Implemented for
/// every [`TenantKey`] that is `Display`: [`TenantId`] and [`Uuid`]
/// (hyphenated), integers (decimal), `String` and `Arc<str>` (as is).
pub trait NatsTenant: TenantKey {
    /// The tenant's subject token: its text, if that is a valid token (not
    /// empty, no `.`, `*`, `>`, whitespace or control character).
    ///
    /// # Errors
    /// [`InvalidTenant`] otherwise; a write for this tenant is rejected
    /// terminally before anything is published (see the [module
    /// docs](self#subjects-ids-the-stream)).
    fn token(&self) -> Result<String, InvalidTenant>;
}

impl<K: TenantKey + fmt::Display> NatsTenant for K {
    fn token(&self) -> Result<String, InvalidTenant> {
        let token = self.to_string();
        if is_token(&token) {
            Ok(token)
        } else {
            Err(InvalidTenant::new(
                self,
                "its text is not a NATS subject token (empty, or holds `.`, `*`, `>`, \
                 whitespace or a control character)",
            ))
        }
    }
}

/// The `Nats-Msg-Id` of an item: `{tenant}:{item_id}`, the tenant's
/// [token](NatsTenant::token) and the item's hyphenated UUID (73 bytes for
/// a UUID tenant).
///
/// # Errors
/// [`InvalidTenant`] for a tenant without a valid token.
pub fn message_id<K: NatsTenant>(tenant: &K, item_id: Uuid) -> Result<String, InvalidTenant> {
    Ok(format!("{}:{}", tenant.token()?, item_id))
}

/// A NATS JetStream [`Sink`] for [`Record`]s of tenants keyed by `K` (see
/// [`NatsTenant`]; [`TenantId`] by default): see the [module docs](self).
pub struct NatsSink<R, K = TenantId> {
    client: Client,
    js: Context,
    name: String,
    prefix: String,
    ack_timeout: Duration,
    max_in_flight: usize,
    _items: PhantomData<fn(R, K)>,
}

impl<R, K> fmt::Debug for NatsSink<R, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("ack_timeout", &self.ack_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl<R: Record, K: NatsTenant> NatsSink<R, K> {
    /// A sink publishing through `client` to `{subject_prefix}.{tenant}`.
    /// The prefix is one or more dot-separated tokens, none empty, without
    /// whitespace, `*` or `>`. The sink's [name](Sink::name) is `nats:` and
    /// the prefix.
    ///
    /// # Errors
    /// [`InvalidSubjectPrefix`] for a prefix outside that grammar.
    pub fn new(client: Client, subject_prefix: &str) -> Result<Self, InvalidSubjectPrefix> {
        if !is_subject_prefix(subject_prefix) {
            return Err(InvalidSubjectPrefix {
                prefix: subject_prefix.to_owned(),
            });
        }
        Ok(NatsSink {
            js: context(&client, DEFAULT_ACK_TIMEOUT),
            client,
            name: format!("nats:{subject_prefix}"),
            prefix: subject_prefix.to_owned(),
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            _items: PhantomData,
        })
    }

    /// Sets the sink's name (the `outbox` metric label, S-W11).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How long to wait for each ack, and for the client to queue each
    /// publish (default [`DEFAULT_ACK_TIMEOUT`]; also the timeout of
    /// [`create_stream`](Self::create_stream)). A write takes at most
    /// about one ack timeout after its last publish is queued.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self.js = context(&self.client, timeout);
        self
    }

    /// At most `n` publishes ahead of their acks (default
    /// [`DEFAULT_MAX_IN_FLIGHT`]; 0 is treated as 1; 1 gives strict order
    /// across reconnects, see [Order](self#order)).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// The subject of `tenant`'s items: `{prefix}.{token}`.
    ///
    /// # Errors
    /// [`InvalidTenant`] for a tenant without a valid
    /// [token](NatsTenant::token).
    pub fn subject(&self, tenant: &K) -> Result<String, InvalidTenant> {
        Ok(format!("{}.{}", self.prefix, tenant.token()?))
    }

    /// The subject filter of every tenant: `{prefix}.*`.
    pub fn subject_filter(&self) -> String {
        format!("{}.*", self.prefix)
    }

    /// The JetStream context the sink publishes through.
    pub fn jetstream(&self) -> &Context {
        &self.js
    }

    /// Creates the stream `name` capturing [`subject_filter`](Self::subject_filter),
    /// file storage, with `duplicate_window` (how long a message id is
    /// remembered: longer than the outbox's `max_retry_duration` plus one
    /// `max_backoff` and one `write_timeout`, see the module docs), or
    /// returns the existing stream of that name unchanged.
    ///
    /// # Errors
    /// The server's or the client's error (invalid name, a subject overlap
    /// with another stream, no JetStream, timeout).
    pub async fn create_stream(
        &self,
        name: &str,
        duplicate_window: Duration,
    ) -> Result<jetstream::stream::Stream, CreateStreamError> {
        self.js
            .get_or_create_stream(StreamConfig {
                name: name.to_owned(),
                subjects: vec![self.subject_filter()],
                storage: StorageType::File,
                duplicate_window,
                ..StreamConfig::default()
            })
            .await
    }

    async fn write_slice(&self, tenant: &K, items: &[R]) -> Result<Written, WriteError> {
        if items.is_empty() {
            return Ok(Written::ALL);
        }
        let token = tenant.token().map_err(WriteError::terminal)?;
        let max_payload = self.client.server_info().max_payload;
        if max_payload > 0 {
            let limit = max_payload.saturating_sub(HEADER_ALLOWANCE);
            if let Some(item) = items.iter().find(|i| i.payload().len() > limit) {
                return Err(WriteError::terminal(PayloadTooLarge {
                    item_id: item.id(),
                    len: item.payload().len(),
                    limit,
                }));
            }
        }
        let subject = format!("{}.{token}", self.prefix);
        let mut pending: VecDeque<PublishAckFuture> = VecDeque::new();
        let mut order = OrderCheck::default();
        for item in items {
            if pending.len() >= self.max_in_flight {
                if let Some(ack) = pending.pop_front() {
                    order.see(ack.await.map_err(publish_error)?.sequence);
                }
            }
            let message = PublishMessage::build()
                .message_id(format!("{token}:{}", item.id()))
                .payload(Bytes::copy_from_slice(item.payload()));
            let ack = self
                .js
                .send_publish(subject.clone(), message)
                .await
                .map_err(publish_error)?;
            pending.push_back(ack);
        }
        while let Some(ack) = pending.pop_front() {
            order.see(ack.await.map_err(publish_error)?.sequence);
        }
        if order.out_of_order {
            tracing::error!(
                sink = %self.name,
                ?tenant,
                items = items.len(),
                "stored out of order: a reconnect in the middle of a write let a later \
                 item be stored before an earlier one (every item is stored once); use \
                 max_in_flight(1) for strict order"
            );
        }
        Ok(Written::ALL)
    }
}

impl<R: Record, K: NatsTenant> NatsSink<R, K> {
    /// Publishes a group's messages, then awaits their acks (S-F1); each
    /// slice's outcome from its own (S-F3).
    async fn write_slices(&self, slices: &[Slice<K, R>]) -> Vec<Result<Written, WriteError>> {
        let mut failed: Vec<Option<WriteError>> = slices.iter().map(|_| None).collect();
        let mut orders: Vec<OrderCheck> = slices.iter().map(|_| OrderCheck::default()).collect();
        let mut pending: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
        let max_payload = self.client.server_info().max_payload;
        let limit = max_payload.saturating_sub(HEADER_ALLOWANCE);
        for (i, slice) in slices.iter().enumerate() {
            let token = match slice.tenant.token() {
                Ok(token) => token,
                Err(e) => {
                    failed[i] = Some(WriteError::terminal(e));
                    continue;
                }
            };
            if max_payload > 0 {
                if let Some(item) = slice.items.iter().find(|i| i.payload().len() > limit) {
                    failed[i] = Some(WriteError::terminal(PayloadTooLarge {
                        item_id: item.id(),
                        len: item.payload().len(),
                        limit,
                    }));
                    continue;
                }
            }
            let subject = format!("{}.{token}", self.prefix);
            for item in &slice.items {
                if failed[i].is_some() {
                    break;
                }
                if pending.len() >= self.max_in_flight {
                    if let Some((j, ack)) = pending.pop_front() {
                        see_ack(j, ack.await, &mut failed, &mut orders);
                    }
                }
                let message = PublishMessage::build()
                    .message_id(format!("{token}:{}", item.id()))
                    .payload(Bytes::copy_from_slice(item.payload()));
                match self.js.send_publish(subject.clone(), message).await {
                    Ok(ack) => pending.push_back((i, ack)),
                    Err(e) => failed[i] = Some(publish_error(e)),
                }
            }
        }
        while let Some((j, ack)) = pending.pop_front() {
            see_ack(j, ack.await, &mut failed, &mut orders);
        }
        failed
            .into_iter()
            .zip(orders)
            .zip(slices)
            .map(|((failed, order), slice)| match failed {
                Some(e) => Err(e),
                None => {
                    if order.out_of_order {
                        tracing::error!(
                            sink = %self.name,
                            tenant = ?slice.tenant,
                            items = slice.items.len(),
                            "stored out of order: a reconnect in the middle of a write let a \
                             later item be stored before an earlier one (every item is stored \
                             once); use max_in_flight(1) for strict order"
                        );
                    }
                    Ok(Written::ALL)
                }
            })
            .collect()
    }
}

/// Files slice `j`'s ack: its sequence for the order check, or its
/// slice's first failure.
fn see_ack(
    j: usize,
    ack: Result<jetstream::publish::PublishAck, PublishError>,
    failed: &mut [Option<WriteError>],
    orders: &mut [OrderCheck],
) {
    match ack {
        Ok(ack) => orders[j].see(ack.sequence),
        Err(e) => {
            if failed[j].is_none() {
                failed[j] = Some(publish_error(e));
            }
        }
    }
}

impl<R: Record, K: NatsTenant> Sink for NatsSink<R, K> {
    type Tenant = K;
    type Item = R;

    fn name(&self) -> &str {
        &self.name
    }

    fn write(
        &self,
        tenant: &K,
        items: &[R],
    ) -> impl std::future::Future<Output = Result<Written, WriteError>> + Send {
        self.write_slice(tenant, items)
    }

    /// Yes: see [`write_group`](Sink::write_group) (S-F1).
    fn takes_groups(&self) -> bool {
        true
    }

    /// One pipeline of publishes for the group (S-F1); see
    /// [the module docs](self#fan-in).
    fn write_group(
        &self,
        slices: &[Slice<K, R>],
    ) -> impl std::future::Future<Output = Vec<Result<Written, WriteError>>> + Send {
        self.write_slices(slices)
    }
}

fn context(client: &Client, timeout: Duration) -> Context {
    jetstream::ContextBuilder::new()
        .timeout(timeout)
        .build(client.clone())
}

/// Whether the acks' stream sequences rise in slice order.
#[derive(Default)]
struct OrderCheck {
    last: Option<u64>,
    out_of_order: bool,
}

impl OrderCheck {
    fn see(&mut self, sequence: u64) {
        if self.last.is_some_and(|last| sequence <= last) {
            self.out_of_order = true;
        }
        self.last = Some(sequence);
    }
}

/// Whether a publish (or ack) error is retryable or terminal: see the
/// [module docs](self).
pub fn publish_error_kind(error: &PublishError) -> ErrorKind {
    match error.kind() {
        PublishErrorKind::Other => {
            let code = error
                .source()
                .and_then(|s| s.downcast_ref::<jetstream::Error>())
                .map(jetstream::Error::error_code);
            match code {
                Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => ErrorKind::Terminal,
                _ => ErrorKind::Retryable,
            }
        }
        _ => ErrorKind::Retryable,
    }
}

fn publish_error(e: PublishError) -> WriteError {
    match publish_error_kind(&e) {
        ErrorKind::Terminal => WriteError::terminal(e),
        _ => WriteError::retryable(e),
    }
}

fn is_subject_prefix(prefix: &str) -> bool {
    !prefix.is_empty() && prefix.split('.').all(is_token)
}

/// Whether `token` is one subject token: not empty, without `.`, `*`, `>`,
/// whitespace or control characters.
fn is_token(token: &str) -> bool {
    !token.is_empty()
        && token
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && c != '.' && c != '*' && c != '>')
}

/// A subject prefix outside the accepted grammar ([`NatsSink::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSubjectPrefix {
    prefix: String,
}

impl fmt::Display for InvalidSubjectPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid subject prefix {:?}: expected dot-separated tokens, none empty, \
             without whitespace, `*` or `>`",
            self.prefix
        )
    }
}

impl StdError for InvalidSubjectPrefix {}

/// A payload over the server's limit: the cause of a terminal error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadTooLarge {
    /// The item.
    pub item_id: Uuid,
    /// Its payload's length, in bytes.
    pub len: usize,
    /// The largest payload accepted: the server's `max_payload` less 1 KiB
    /// for headers, in bytes.
    pub limit: usize,
}

impl fmt::Display for PayloadTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "payload of item {} is {} bytes, over the limit of {} bytes (the \
             server's max_payload less room for headers)",
            self.item_id, self.len, self.limit
        )
    }
}

impl StdError for PayloadTooLarge {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_tenant_colon_item() {
        let t = TenantId::from_u128(1);
        let id = message_id(&t, Uuid::from_u128(2)).unwrap();
        assert_eq!(
            id,
            "00000000-0000-0000-0000-000000000001:00000000-0000-0000-0000-000000000002"
        );
        let item = Uuid::from_u128(2);
        assert_eq!(
            message_id(&u64::MAX, item).unwrap(),
            format!("18446744073709551615:{item}")
        );
        assert_eq!(message_id(&-7i64, item).unwrap(), format!("-7:{item}"));
        assert_eq!(
            message_id(&std::sync::Arc::<str>::from("acme"), item).unwrap(),
            format!("acme:{item}")
        );
    }

    #[test]
    fn string_keys_that_are_not_tokens_are_refused() {
        assert_eq!("acme-eu_1:x".to_owned().token().unwrap(), "acme-eu_1:x");
        for bad in ["", "a.b", "a*", ">", "a b", "a\tb", "a\u{7}"] {
            let err = bad.to_owned().token().unwrap_err();
            assert_eq!(err.tenant(), format!("{bad:?}"));
            assert!(err.to_string().contains("subject token"), "{err}");
            assert!(message_id(&bad.to_owned(), Uuid::nil()).is_err());
        }
    }

    #[test]
    fn prefixes_are_validated() {
        for ok in ["usage", "a.b.c", "tenant-events", "x_1"] {
            assert!(is_subject_prefix(ok), "{ok}");
        }
        for bad in [
            "", ".", "a.", ".a", "a..b", "a b", "a.*", "a.>", "a\tb", "a\nb",
        ] {
            assert!(!is_subject_prefix(bad), "{bad:?}");
        }
    }

    #[test]
    fn order_check_flags_a_sequence_that_does_not_rise() {
        let mut o = OrderCheck::default();
        for s in [3, 4, 9] {
            o.see(s);
        }
        assert!(!o.out_of_order);
        o.see(5);
        assert!(o.out_of_order);
    }

    #[test]
    fn publish_errors_classify() {
        for kind in [
            PublishErrorKind::TimedOut,
            PublishErrorKind::BrokenPipe,
            PublishErrorKind::StreamNotFound,
            PublishErrorKind::MaxAckPending,
            PublishErrorKind::Other,
        ] {
            assert_eq!(
                publish_error_kind(&PublishError::new(kind)),
                ErrorKind::Retryable
            );
        }
    }
}
