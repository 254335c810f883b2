//! When the relay reads and what a page request asks for: every owned
//! partition after its cursor, and every saturated tenant with room again
//! between its last row taken and its partition's cursor, in one
//! statement (S-T7, S-T9).

use std::time::Duration;

use super::types::{
    OpId, Page, PageRequest, PartitionRead, RelayEvent, StoreError, StoreOp, TenantRead,
};
use super::{Quarantine, Relay, Source};
use crate::core::time::Time;

/// The smallest share a partition gets of the read-ahead's room per page.
const MIN_PARTITION_ROWS: u32 = 64;

#[derive(Debug, Default)]
pub(crate) struct Reads {
    /// A read is due (a wake-up, a partition ready, more rows likely).
    pub(crate) wanted: bool,
    /// The read in flight.
    pub(crate) out: Option<(OpId, PageRequest)>,
    /// When an idle relay reads anyway.
    pub(crate) next_poll: Option<Time>,
    /// After a failed read: not before then.
    pub(crate) retry_at: Option<Time>,
    pub(crate) failures: u32,
    /// The last page suggested more rows than it brought (a full read, or
    /// rows left for want of room).
    pub(crate) more: bool,
}

impl Reads {
    pub(crate) fn timeout(&self) -> Option<Time> {
        if self.out.is_some() {
            return None;
        }
        [self.next_poll, self.retry_at].into_iter().flatten().min()
    }
}

impl Relay {
    pub(super) fn poll_read(&mut self, now: Time) -> Option<StoreOp> {
        if let Some(at) = self.reads.retry_at {
            if at > now {
                return None;
            }
            self.reads.retry_at = None;
            self.reads.wanted = true;
        }
        if !self.reads.wanted || self.reads.out.is_some() || !self.may_read() {
            return None;
        }
        let request = self.page_request()?;
        self.reads.wanted = false;
        let op = self.ops.id();
        self.reads.out = Some((op, request.clone()));
        Some(StoreOp::ReadPage { op, request })
    }

    /// No read while a suspect waits for, or has, the relay to itself; a
    /// suspect waiting for its retry holds no one back (S-T18).
    fn may_read(&self) -> bool {
        match self.quarantine {
            Quarantine::Off | Quarantine::Waiting(_) => true,
            Quarantine::Draining(_) => self.open == 0 && self.records.idle(),
            Quarantine::Alone(_) => false,
        }
    }

    fn page_request(&self) -> Option<PageRequest> {
        let room = self
            .config
            .read_ahead
            .saturating_sub(self.held)
            .min(self.config.page_rows);
        let only = match &self.quarantine {
            Quarantine::Draining(Source::Partition(p)) => Some(*p),
            Quarantine::Draining(Source::Tenant(_)) => Some(u32::MAX),
            _ => None,
        };
        let ready: Vec<(u32, Option<super::Position>)> = self
            .partitions
            .iter()
            .filter(|(n, p)| p.ready && only.is_none_or(|o| o == **n))
            .map(|(n, p)| (*n, p.cursor))
            .collect();
        let tenants = self.catch_up_reads(room);
        if ready.is_empty() && !tenants.is_empty() {
            return Some(PageRequest {
                order: self.config.order,
                partitions: Vec::new(),
                tenants,
            });
        }
        if room == 0 || ready.is_empty() {
            return None;
        }
        let n = u32::try_from(ready.len()).unwrap_or(u32::MAX);
        let limit = (room / n)
            .max(room.min(MIN_PARTITION_ROWS))
            .min(self.config.page_rows)
            .max(1);
        let partitions = ready
            .iter()
            .map(|&(partition, after)| PartitionRead {
                partition,
                after,
                limit,
            })
            .collect();
        Some(PageRequest {
            order: self.config.order,
            partitions,
            tenants,
        })
    }

    /// A read for each saturated tenant with a quarter of its share free.
    fn catch_up_reads(&self, room: u32) -> Vec<TenantRead> {
        let share = self.config.tenant_share;
        let mut reads = Vec::new();
        let only = match &self.quarantine {
            Quarantine::Draining(Source::Tenant(t)) => Some(t),
            Quarantine::Draining(Source::Partition(_)) => return reads,
            _ => None,
        };
        for tenant in &self.tenants.saturated {
            if only.is_some_and(|o| o != tenant) {
                continue;
            }
            let Some(t) = self.tenants.get(tenant) else {
                continue;
            };
            let free = share.saturating_sub(self.tenants.held(tenant)).min(room);
            let Some(hold) = t.hold else { continue };
            let Some(until) = self.partitions.get(&t.partition).and_then(|p| p.cursor) else {
                continue;
            };
            if free == 0 || free < (share / 4).max(1) {
                continue;
            }
            reads.push(TenantRead {
                partition: t.partition,
                tenant: tenant.clone(),
                after: hold.after,
                until,
                limit: free.min(self.config.page_rows),
            });
        }
        reads
    }

    /// The answer to the read `op`.
    pub fn handle_page(&mut self, now: Time, op: OpId, page: Result<Page, StoreError>) {
        let Some((sent, request)) = self.reads.out.take() else {
            return;
        };
        if sent != op {
            self.reads.out = Some((sent, request));
            return;
        }
        match page {
            Ok(page) => {
                self.reads.failures = 0;
                self.reads.more = false;
                self.take_page(&request, page);
                self.record_page();
                if self.reads.more {
                    self.reads.wanted = true;
                } else {
                    self.reads.next_poll = Some(now + self.config.poll_interval);
                }
            }
            Err(e) => {
                self.events
                    .push_back(RelayEvent::StoreFailed { kind: e.kind() });
                let wait = backoff(
                    self.config.retry_backoff,
                    self.config.max_retry_backoff,
                    self.reads.failures,
                );
                self.reads.failures = self.reads.failures.saturating_add(1);
                self.reads.retry_at = Some(now + wait);
            }
        }
    }
}

pub(crate) fn backoff(first: Duration, max: Duration, failures: u32) -> Duration {
    first.saturating_mul(1u32 << failures.min(20)).min(max)
}
