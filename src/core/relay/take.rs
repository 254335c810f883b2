//! Taking a page: which rows go to the engine, which are skipped for now,
//! which go straight to the dead-letter table, and where each cursor
//! stops (S-T5..S-T9, S-T18, S-T19).

use super::tenants::{Ended, Entry, Why};
use super::types::{
    DeadLetterRow, DeadReason, Page, PageRequest, PartitionRead, Position, ReadOrder, RelayEvent,
    Row, TenantRead,
};
use super::{Key, Quarantine, Relay, Source};

/// What became of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Taken (delivered, or bound for the dead-letter table).
    Taken,
    /// Left for a later read of its tenant (held back).
    Skipped,
    /// Taken, and nothing more this page (a suspect delivered alone).
    TakenLast,
    /// Not taken, and nothing more this page (no room, or a suspect must
    /// wait).
    Stop,
}

impl Relay {
    pub(super) fn take_page(&mut self, request: &PageRequest, page: Page) {
        for (read, rows) in request.tenants.iter().zip(page.tenants) {
            if !self.take_catch_up(read, rows) {
                self.reads.more = true;
                return;
            }
        }
        for (read, rows) in request.partitions.iter().zip(page.partitions) {
            if !self.take_partition(read, rows) {
                self.reads.more = true;
                return;
            }
        }
    }

    /// The position the cursor compares: (xid, id), or the id alone under
    /// the planted order.
    fn position_of(&self, row: &Row) -> Position {
        match self.config.order {
            ReadOrder::Watermark => row.position(),
            ReadOrder::IdAboveLastSeen => Position { xid: 0, id: row.id },
        }
    }

    /// Takes one partition's rows; `false` to stop the page.
    fn take_partition(&mut self, read: &PartitionRead, rows: Vec<Row>) -> bool {
        let current = self.partitions.get(&read.partition);
        if !current.is_some_and(|p| p.ready && p.cursor == read.after) {
            return true;
        }
        let full = rows.len() >= read.limit as usize;
        let mut cursor = read.after;
        let mut go_on = true;
        for row in rows {
            let at = self.position_of(&row);
            if row.partition != read.partition || cursor.is_some_and(|c| at <= c) {
                continue;
            }
            let held_back = self
                .tenants
                .get(&row.tenant)
                .is_some_and(|t| t.hold.is_some());
            let step = if held_back {
                Step::Skipped
            } else {
                self.take_row(row, Source::Partition(read.partition))
            };
            match step {
                Step::Taken | Step::Skipped => cursor = Some(at),
                Step::TakenLast => {
                    cursor = Some(at);
                    go_on = false;
                    break;
                }
                Step::Stop => {
                    go_on = false;
                    break;
                }
            }
        }
        if let Some(p) = self.partitions.get_mut(&read.partition) {
            p.cursor = cursor;
        }
        self.reads.more |= full;
        go_on
    }

    /// Takes a catching-up tenant's rows; `false` to stop the page.
    fn take_catch_up(&mut self, read: &TenantRead, rows: Vec<Row>) -> bool {
        let current = self.tenants.get(&read.tenant).and_then(|t| t.hold);
        if !current.is_some_and(|h| h.why == Why::Saturated && h.after == read.after) {
            return true;
        }
        let full = rows.len() >= read.limit as usize;
        let mut caught_up = !full;
        let mut go_on = true;
        for row in rows {
            let source = Source::Tenant(read.tenant.clone());
            match self.take_row(row, source) {
                Step::Taken => {}
                Step::Skipped => {
                    caught_up = false;
                    break;
                }
                Step::TakenLast | Step::Stop => {
                    caught_up = false;
                    go_on = false;
                    break;
                }
            }
        }
        let saturated = self
            .tenants
            .get(&read.tenant)
            .is_some_and(|t| t.hold.is_some_and(|h| h.why == Why::Saturated));
        if caught_up && saturated {
            self.tenants.release(&read.tenant);
        } else if saturated {
            // Still behind: the next catch-up starts after the last row taken.
            self.tenants.hold(&read.tenant, Why::Saturated);
            self.reads.more = true;
        }
        go_on
    }

    /// One row of a tenant not held back (or catching up).
    fn take_row(&mut self, row: Row, source: Source) -> Step {
        let version = row.codec_version;
        if self.config.retired_versions.contains(&version) {
            return self.take_dead(row, DeadReason::RetiredVersion);
        }
        if !self.config.known_versions.contains(&version) {
            self.tenants.entry(&row.tenant, row.partition);
            self.tenants.hold(&row.tenant, Why::UnknownVersion(version));
            self.events.push_back(RelayEvent::UnknownVersion {
                id: row.id,
                partition: row.partition,
                version,
            });
            return Step::Skipped;
        }
        if row.crashes >= self.config.crash_limit() {
            return self.take_dead(row, DeadReason::Poisoned);
        }
        if self.held >= self.config.read_ahead {
            return Step::Stop;
        }
        if self.tenants.held(&row.tenant) >= self.config.tenant_share {
            self.tenants.entry(&row.tenant, row.partition);
            self.tenants.hold(&row.tenant, Why::Saturated);
            return Step::Skipped;
        }
        if row.crashes > 0 {
            if matches!(
                self.quarantine,
                Quarantine::Alone(_) | Quarantine::Waiting(_)
            ) {
                // A suspect is in the engine: this one, and its tenant's
                // later rows, wait in the table until it ends (S-T18).
                self.tenants.entry(&row.tenant, row.partition);
                self.tenants.hold(&row.tenant, Why::Deferred);
                return Step::Skipped;
            }
            // Alone: no other row open, and no other record live (a row
            // written but not yet removed is still counted by its record).
            let alone = self.open == 0 && self.records.idle();
            if !alone {
                self.quarantine = Quarantine::Draining(source);
                return Step::Stop;
            }
            self.quarantine = Quarantine::Alone(row.id);
            self.events
                .push_back(RelayEvent::Quarantined { id: row.id });
            self.deliver(row, None);
            return Step::TakenLast;
        }
        self.deliver(row, None);
        Step::Taken
    }

    /// A row that goes to the dead-letter table without a write.
    fn take_dead(&mut self, row: Row, reason: DeadReason) -> Step {
        if self.held >= self.config.read_ahead {
            return Step::Stop;
        }
        let dead = DeadLetterRow {
            id: row.id,
            reason,
            attempts: 0,
        };
        let tenant = row.tenant.clone();
        self.deliver(row, Some(Ended::Dead(dead)));
        self.collect_removable(&tenant);
        Step::Taken
    }

    /// Holds `row` for its tenant; hands it to the engine unless it already
    /// `ended`.
    fn deliver(&mut self, row: Row, ended: Option<Ended>) {
        let at = self.position_of(&row);
        let open = ended.is_none();
        let t = self.tenants.entry(&row.tenant, row.partition);
        t.queue.push_back(Entry { id: row.id, ended });
        t.last_taken = Some(at);
        self.keys.insert(
            row.id,
            Key {
                tenant: row.tenant.clone(),
                partition: row.partition,
                open,
                record: None,
            },
        );
        self.held += 1;
        if open {
            self.open += 1;
            // To the engine once its page's in-flight record is durable
            // (S-T17).
            self.records.stage(row);
        }
    }
}
