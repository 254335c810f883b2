//! Writes checked by epoch (S-E4..S-E7): one explicit transaction per
//! group (a slice alone is a group of one) under `SET LOCAL
//! idle_in_transaction_session_timeout`, the inserts, then the epoch check
//! as the last statement before COMMIT.

use std::collections::VecDeque;
use std::fmt;

use super::epochs::{millis, EpochSql};
use super::{pg_error, pool_error, GroupFailed, PayloadTooLarge, PgTenant, PostgresSink};
use super::{Record, MAX_PAYLOAD_BYTES};
use crate::sink::{ErrorKind, WriteEpoch, WriteError, Written};

/// The cause of a [`WriteError::stale_epoch`] from the PostgreSQL sink: the
/// write's epoch is no longer the one installed for its partition (a newer
/// owner installed its own, S-E2). Nothing of the write committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleEpoch {
    /// The write's lease.
    pub epoch: WriteEpoch,
}

impl fmt::Display for StaleEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "epoch {} of partition {} is no longer the one installed: nothing committed",
            self.epoch.epoch, self.epoch.partition
        )
    }
}

impl std::error::Error for StaleEpoch {}

type Outcomes = Vec<Option<Result<Written, WriteError>>>;

impl<R: Record, K: PgTenant> PostgresSink<R, K> {
    /// Writes `slices` (tenant, items, epoch), each with its own outcome
    /// (S-F3): a slice that cannot be sent is rejected alone before any
    /// I/O; the rest go in one transaction checked by epoch. A stale
    /// partition fails its own slices `stale_epoch` and the others are
    /// written again without them; a terminal failure of a group writes
    /// each slice again alone; any other failure fails the group's slices
    /// with it.
    pub(super) async fn write_checked(
        &self,
        epochs: &EpochSql,
        slices: &[(&K, &[R], WriteEpoch)],
    ) -> Vec<Result<Written, WriteError>> {
        let mut outcomes: Outcomes = slices.iter().map(|_| None).collect();
        let mut live = Vec::new();
        for (i, (tenant, items, _)) in slices.iter().enumerate() {
            if items.is_empty() {
                outcomes[i] = Some(Ok(Written::ALL));
            } else if let Some(item) = items.iter().find(|i| i.payload().len() > MAX_PAYLOAD_BYTES)
            {
                outcomes[i] = Some(Err(WriteError::terminal(PayloadTooLarge {
                    item_id: item.id(),
                    len: item.payload().len(),
                })));
            } else if let Err(e) = tenant.param() {
                outcomes[i] = Some(Err(WriteError::terminal(e)));
            } else {
                live.push(i);
            }
        }
        // Each round settles a group or splits it into smaller ones: it ends.
        let mut groups: VecDeque<Vec<usize>> = VecDeque::new();
        if !live.is_empty() {
            groups.push_back(live);
        }
        while let Some(group) = groups.pop_front() {
            match self.checked_tx(epochs, slices, &group).await {
                Ok(stale) if stale.is_empty() => {
                    for &i in &group {
                        outcomes[i] = Some(Ok(Written::ALL));
                    }
                }
                Ok(stale) => {
                    let (gone, rest): (Vec<usize>, Vec<usize>) = group
                        .iter()
                        .partition(|&&i| stale.contains(&slices[i].2.partition));
                    for i in gone {
                        let cause = StaleEpoch { epoch: slices[i].2 };
                        outcomes[i] = Some(Err(WriteError::stale_epoch(cause)));
                    }
                    if !rest.is_empty() {
                        groups.push_back(rest);
                    }
                }
                Err(e) if e.is_terminal() && group.len() > 1 => {
                    // Which slice is bad is unknown: each goes alone.
                    groups.extend(group.iter().map(|&i| vec![i]));
                }
                Err(e) => fail_group(&mut outcomes, &group, e),
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Ok(Written::ALL)))
            .collect()
    }

    /// One transaction: the group's rows, then the check of its epochs as
    /// the last statement. Commits and answers no stale partition if the
    /// check passed; else rolls back and answers the stale partitions.
    async fn checked_tx(
        &self,
        epochs: &EpochSql,
        slices: &[(&K, &[R], WriteEpoch)],
        group: &[usize],
    ) -> Result<Vec<u32>, WriteError> {
        let mut tenants = Vec::new();
        let mut rows: Vec<&R> = Vec::new();
        let mut leases = Vec::with_capacity(group.len());
        for &i in group {
            let (tenant, items, epoch) = slices[i];
            let t = tenant.param().map_err(WriteError::terminal)?;
            for item in items {
                tenants.push(t.clone());
                rows.push(item);
            }
            leases.push((epoch.partition, epoch.epoch));
        }
        let mut client = self.pool.get().await.map_err(pool_error)?;
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.batch_execute(&format!(
            "SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
            millis(self.idle_timeout)
        ))
        .await
        .map_err(pg_error)?;
        let stmt = tx.prepare_cached(&self.group_sql).await.map_err(pg_error)?;
        let mut at = 0;
        while at < rows.len() {
            let n = super::rows_in_statement(&rows[at..], self.max_rows, self.max_bytes);
            let (ids, payloads) = super::columns(&rows[at..at + n]);
            let ts = &tenants[at..at + n];
            tx.execute(&stmt, &[&ts, &ids, &payloads])
                .await
                .map_err(pg_error)?;
            at += n;
        }
        let check = tx
            .prepare_typed_cached(epochs.check_sql(), &EpochSql::CHECK_TYPES)
            .await
            .map_err(pg_error)?;
        let stale = epochs
            .check(&*tx, &check, &leases)
            .await
            .map_err(pg_error)?;
        if stale.is_empty() {
            tx.commit().await.map_err(pg_error)?;
        } else {
            // Nothing commits either way: a failed ROLLBACK leaves a broken
            // connection, which the pool drops.
            let _ = tx.rollback().await;
        }
        Ok(stale)
    }
}

/// Every slice of `group` fails with `e`: the first carries it whole, the
/// others its text (S-F4), of the same kind.
fn fail_group(outcomes: &mut Outcomes, group: &[usize], e: WriteError) {
    let text = e.to_string();
    let kind = e.kind();
    outcomes[group[0]] = Some(Err(e));
    for &i in &group[1..] {
        let again = GroupFailed(text.clone());
        outcomes[i] = Some(Err(match kind {
            ErrorKind::Terminal => WriteError::terminal(again),
            _ => WriteError::retryable(again),
        }));
    }
}
