//! Epochs in a PostgreSQL database (S-E1..S-E4): one row per partition
//! holding the highest epoch installed and who installed it. The outbox
//! table's store keeps its table beside the outbox's
//! (`table::Store::install_epoch`); the [`PostgresSink`](super::PostgresSink)
//! keeps one beside its own table
//! ([`with_epochs`](super::PostgresSink::with_epochs)). Both run the
//! statements below.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "outbox_items_epoch" (
//!     partition   integer PRIMARY KEY,
//!     epoch       bigint  NOT NULL,
//!     holder      text,
//!     incarnation bigint  NOT NULL DEFAULT 0
//! );
//! ```
//!
//! - **Install** (a takeover, S-E2): one transaction under `SET LOCAL
//!   lock_timeout`: the row becomes `(epoch, holder, incarnation)` where
//!   its epoch is lower (or it is absent); where it already holds exactly
//!   this install it is left as is (a retried install, S-E3); anything
//!   else is [`Installed::Superseded`]. Only an install updates the row.
//! - **Check** (a write, S-E4): `SELECT ... FOR SHARE` of the write's
//!   partitions' rows, in partition order, as the last statement before
//!   COMMIT; it passes if each row holds the write's epoch. The shared
//!   locks hold until the transaction ends, so no install commits between
//!   the check and the COMMIT; shared locks do not conflict with each
//!   other, so writes never queue behind one another.

use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

use crate::core::lease::Holder;

/// What an epoch install found (S-E2, S-E3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    /// The epoch is installed for this holder (now, or already by this
    /// same install: a retry is idempotent).
    Installed,
    /// A higher epoch is installed, or this epoch for another holder
    /// (S-L11): this install never becomes writable.
    Superseded {
        /// The epoch installed.
        current: u64,
    },
}

/// One row of an epoch table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkEpoch {
    /// The partition.
    pub partition: u32,
    /// The highest epoch installed.
    pub epoch: u64,
    /// Who installed it: its instance id (`None` for a row written
    /// without one).
    pub holder: Option<String>,
    /// The holder's incarnation.
    pub incarnation: u64,
}

/// The statements over one epoch table, named once (quoted).
#[derive(Clone, Debug)]
pub(crate) struct EpochSql {
    table: String,
    install: String,
    check: String,
}

/// `u64` epochs travel as `bigint` (saturating).
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A duration as whole milliseconds for a `SET LOCAL`, at least 1.
pub(crate) fn millis(d: Duration) -> u128 {
    d.as_millis().max(1)
}

impl EpochSql {
    /// The statements for the table `quoted` (already quoted for SQL).
    pub(crate) fn new(quoted: &str) -> Self {
        EpochSql {
            table: quoted.to_owned(),
            install: format!(
                "INSERT INTO {t} (partition, epoch, holder, incarnation) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (partition) DO UPDATE SET epoch = EXCLUDED.epoch, \
                   holder = EXCLUDED.holder, incarnation = EXCLUDED.incarnation \
                 WHERE {t}.epoch < EXCLUDED.epoch RETURNING epoch",
                t = quoted
            ),
            check: format!(
                "SELECT e.partition FROM {quoted} e \
                 JOIN unnest($1::int[], $2::bigint[]) AS c(p, ep) \
                   ON e.partition = c.p AND e.epoch = c.ep \
                 ORDER BY e.partition FOR SHARE OF e"
            ),
        }
    }

    /// `CREATE TABLE IF NOT EXISTS` for the table.
    pub(crate) fn schema(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    \
                 partition   integer PRIMARY KEY,\n    \
                 epoch       bigint  NOT NULL,\n    \
                 holder      text,\n    \
                 incarnation bigint  NOT NULL DEFAULT 0\n\
             );\n",
            self.table
        )
    }

    /// Every row, by partition.
    pub(crate) async fn read(
        &self,
        client: &impl GenericClient,
    ) -> Result<Vec<SinkEpoch>, tokio_postgres::Error> {
        let sql = format!(
            "SELECT partition, epoch, holder, incarnation FROM {} ORDER BY partition",
            self.table
        );
        let rows = client.query(&sql, &[]).await?;
        Ok(rows
            .iter()
            .map(|r| SinkEpoch {
                partition: u32::try_from(r.get::<_, i32>(0)).unwrap_or(0),
                epoch: to_u64(r.get(1)),
                holder: r.get(2),
                incarnation: to_u64(r.get(3)),
            })
            .collect())
    }

    /// The install (S-E2, S-E3) in one transaction of `client`'s, waiting
    /// at most `lock_timeout` for writes' shared locks (then SQLSTATE
    /// `55P03`).
    pub(crate) async fn install(
        &self,
        client: &mut tokio_postgres::Client,
        partition: u32,
        epoch: u64,
        holder: &Holder,
        lock_timeout: Duration,
    ) -> Result<Installed, tokio_postgres::Error> {
        let tx = client.transaction().await?;
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{}ms'",
            millis(lock_timeout)
        ))
        .await?;
        let p = partition as i32;
        let e = to_i64(epoch);
        let incarnation = to_i64(holder.incarnation);
        let done = tx
            .query_typed_opt(
                &self.install,
                &[
                    (&p, Type::INT4),
                    (&e, Type::INT8),
                    (&holder.instance.as_str(), Type::TEXT),
                    (&incarnation, Type::INT8),
                ],
            )
            .await?;
        let answer = if done.is_some() {
            Installed::Installed
        } else {
            // The ON CONFLICT locked the row: this read sees it as it stays.
            let row = tx
                .query_typed_one(
                    &format!(
                        "SELECT epoch, holder, incarnation FROM {} WHERE partition = $1",
                        self.table
                    ),
                    &[(&p, Type::INT4)],
                )
                .await?;
            let (current, who, inc) = (
                row.get::<_, i64>(0),
                row.get::<_, Option<String>>(1),
                row.get::<_, i64>(2),
            );
            let ours = current == e
                && who.as_deref() == Some(holder.instance.as_str())
                && inc == incarnation;
            if ours {
                Installed::Installed
            } else {
                Installed::Superseded {
                    current: to_u64(current),
                }
            }
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// The check (S-E4) on `client`, inside the write's transaction: the
    /// partitions whose `(partition, epoch)` is not the one installed, in
    /// order (empty: the check passed). Takes the rows' shared locks in
    /// partition order.
    /// The check's statement text, to prepare (cached per connection) with
    /// [`EpochSql::CHECK_TYPES`]: prepared once, it is not parsed and
    /// planned again for every write.
    pub(crate) fn check_sql(&self) -> &str {
        &self.check
    }

    /// The check's parameter types: partitions, epochs.
    pub(crate) const CHECK_TYPES: [Type; 2] = [Type::INT4_ARRAY, Type::INT8_ARRAY];

    pub(crate) async fn check(
        &self,
        client: &impl GenericClient,
        statement: &tokio_postgres::Statement,
        epochs: &[(u32, u64)],
    ) -> Result<Vec<u32>, tokio_postgres::Error> {
        let mut sorted = epochs.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let (ps, es): (Vec<i32>, Vec<i64>) =
            sorted.iter().map(|&(p, e)| (p as i32, to_i64(e))).unzip();
        let rows = client.query(statement, &[&ps, &es]).await?;
        let held: Vec<u32> = rows
            .iter()
            .map(|r| u32::try_from(r.get::<_, i32>(0)).unwrap_or(u32::MAX))
            .collect();
        // A partition named with two epochs matches one row at most: it is
        // stale for the other.
        let mut stale: Vec<u32> = Vec::new();
        for (i, &(p, _)) in sorted.iter().enumerate() {
            let twice =
                i > 0 && sorted[i - 1].0 == p || sorted.get(i + 1).is_some_and(|&(q, _)| q == p);
            if (twice || !held.contains(&p)) && stale.last() != Some(&p) {
                stale.push(p);
            }
        }
        Ok(stale)
    }
}
