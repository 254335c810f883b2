//! Checks of the contract's "Staging" section: admission before the fence
//! (S-W9), the capacity bounds (S-A1, S-B5, S-B7) and the cause of every
//! refusal at stage time (I5).

use super::{Harness, Violation};
use crate::core::DropReason;

impl Harness {
    /// S-W9: no item is accepted once the fence is up.
    pub(super) fn check_s_w9_accepted_before_the_fence(&self, id: u64) -> Result<(), Violation> {
        self.expect(!self.engine.is_shutting_down(), "S-W9", || {
            format!("item {id} accepted after the fence")
        })
    }

    /// S-B7: no item is accepted for a tenant already at its quota
    /// (`tenant_pending`: its pending items before the stage).
    pub(super) fn check_s_b7_tenant_quota(
        &self,
        id: u64,
        tenant: u8,
        tenant_pending: usize,
    ) -> Result<(), Violation> {
        self.expect(
            self.config
                .tenant_capacity()
                .is_none_or(|c| tenant_pending < c),
            "S-B7",
            || format!("item {id} accepted with tenant {tenant} at its quota"),
        )
    }

    /// I5: an item dropped at stage time has the cause its reason names: the
    /// outbox full by items or bytes (`buffer_full`), its tenant at its
    /// quota (`tenant_full`); never `sink_error`. The figures are those
    /// before the stage; `weight` is the item's (0 without a weigher).
    pub(super) fn check_i5_stage_drop_has_its_cause(
        &self,
        id: u64,
        reason: DropReason,
        pending_before: u64,
        tenant_pending: usize,
        weight: u64,
    ) -> Result<(), Violation> {
        let cause = match reason {
            DropReason::BufferFull => {
                self.config
                    .capacity()
                    .is_some_and(|c| pending_before >= c as u64)
                    || self
                        .config
                        .capacity_bytes()
                        .is_some_and(|c| self.pending_bytes + weight > c)
            }
            DropReason::TenantFull => self
                .config
                .tenant_capacity()
                .is_some_and(|c| tenant_pending >= c),
            // The engine alone has no journal: it never refuses
            // for one.
            DropReason::SinkError | DropReason::EncodeFailed | DropReason::JournalFull => false,
            // An outbox with an outbox table refuses every stage (S-T32).
            DropReason::TableOnly => self.config.table_only,
        };
        self.expect(cause, "I5", || {
            format!("item {id} dropped under {reason} without its cause")
        })
    }

    /// I5: an item is refused (lost under `shutdown`) only once the fence
    /// is up.
    pub(super) fn check_i5_refused_only_after_the_fence(&self, id: u64) -> Result<(), Violation> {
        self.expect(self.engine.is_shutting_down(), "I5", || {
            format!("item {id} refused while open")
        })
    }

    /// S-A1: never more items pending than `capacity`.
    pub(super) fn check_s_a1_capacity(&self, pending: u64) -> Result<(), Violation> {
        if let Some(cap) = self.config.capacity() {
            self.expect(pending <= cap as u64, "S-A1", || {
                format!("{pending} pending > capacity {cap}")
            })?;
        }
        Ok(())
    }

    /// S-B5: never more bytes pending than `capacity_bytes`.
    pub(super) fn check_s_b5_capacity_bytes(&self, bytes: u64) -> Result<(), Violation> {
        if let Some(cap) = self.config.capacity_bytes() {
            self.expect(bytes <= cap, "S-B5", || {
                format!("{bytes} bytes pending > {cap}")
            })?;
        }
        Ok(())
    }
}
