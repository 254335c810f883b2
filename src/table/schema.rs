//! Numbered, forward-only migrations (S-T2, S-T3): the SQL files under
//! `src/table/migrations/`, applied by [`migrate`] under an advisory lock,
//! each recorded in the outbox's schema table with the oldest crate
//! schema version that can still run against it.
//!
//! # Rolling deploys
//! Migrations are additive: a new column has a default or is nullable, a
//! new table or index is only added, nothing an older crate reads or
//! writes is dropped or renamed in the same release. Each migration
//! declares `min_reader`, the oldest crate schema version
//! ([`SCHEMA_VERSION`] of that crate) that still works against it. A relay
//! of a crate knowing migrations up to `L` runs against a table at version
//! `S` when `S >= MIN_SCHEMA_VERSION` and either `S <= L` or the table's
//! `min_reader <= L` ([`check`]). So during a rolling deploy, the new
//! release runs `migrate` first; instances of the old release keep
//! running against the newer additive schema; a migration that is not
//! additive sets `min_reader` to its own version, and the old release's
//! relays refuse to start (and keep running ones on their last read) until
//! they are replaced.

use std::fmt;

use tokio_postgres::GenericClient;

use super::names::TableNames;
use super::store::SchemaInfo;
use crate::core::relay::StoreError;

/// One migration: its number, name, SQL (with the name tokens) and the
/// oldest crate schema version that can still run against it.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// Its number, from 1, without gaps.
    pub version: u32,
    /// A short name.
    pub name: &'static str,
    /// The statements, with `{outbox}`-style tokens for the names.
    pub sql: &'static str,
    /// The oldest [`SCHEMA_VERSION`] of a crate that can still run against
    /// a table at this version.
    pub min_reader: u32,
}

/// Every migration this crate knows, in order.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "outbox",
    sql: include_str!("migrations/0001_outbox.sql"),
    min_reader: 1,
}];

/// The highest schema version this crate knows.
pub const SCHEMA_VERSION: u32 = 1;

/// The lowest schema version this crate's relay runs against.
pub const MIN_SCHEMA_VERSION: u32 = 1;

/// Default P: 64 partitions (S-T4), enough for 64 instances to share the
/// table; fixed when the table is created.
pub const DEFAULT_PARTITIONS: u32 = 64;

/// The most partitions a table may have.
pub const MAX_PARTITIONS: u32 = 65_536;

/// Why a schema is refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The table is at a version this crate does not know and cannot run
    /// against (its `min_reader` is above [`SCHEMA_VERSION`]).
    Unknown {
        /// The table's version.
        version: u32,
        /// The oldest crate schema version that runs against it.
        min_reader: u32,
    },
    /// The table is behind this crate: run [`migrate`] first.
    Behind {
        /// The table's version (0: no table).
        version: u32,
    },
    /// [`migrate`] was asked for another P than the table has.
    Partitions {
        /// The table's P.
        table: u32,
        /// The P asked for.
        asked: u32,
    },
    /// P outside `1..=MAX_PARTITIONS`.
    BadPartitions(u32),
    /// The database failed.
    Store(StoreError),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Unknown {
                version,
                min_reader,
            } => write!(
                f,
                "the outbox table is at schema version {version}, which needs a crate knowing \
                 version {min_reader} or later; this crate knows up to {SCHEMA_VERSION}"
            ),
            SchemaError::Behind { version } => write!(
                f,
                "the outbox table is at schema version {version}, below {MIN_SCHEMA_VERSION}: \
                 run the migrations"
            ),
            SchemaError::Partitions { table, asked } => write!(
                f,
                "the outbox table has {table} partitions, not {asked}: changing P is an offline \
                 procedure"
            ),
            SchemaError::BadPartitions(p) => {
                write!(f, "{p} partitions: P must be in 1..={MAX_PARTITIONS}")
            }
            SchemaError::Store(e) => write!(f, "the database failed: {e}"),
        }
    }
}

impl std::error::Error for SchemaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SchemaError::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl From<StoreError> for SchemaError {
    fn from(e: StoreError) -> Self {
        SchemaError::Store(e)
    }
}

/// Whether a relay of this crate may run against `schema` (see the
/// [module docs](self)).
///
/// # Errors
/// [`SchemaError::Behind`] or [`SchemaError::Unknown`].
pub fn check(schema: &SchemaInfo) -> Result<(), SchemaError> {
    if schema.version < MIN_SCHEMA_VERSION {
        return Err(SchemaError::Behind {
            version: schema.version,
        });
    }
    if schema.version > SCHEMA_VERSION && schema.min_reader > SCHEMA_VERSION {
        return Err(SchemaError::Unknown {
            version: schema.version,
            min_reader: schema.min_reader,
        });
    }
    Ok(())
}

/// What [`migrate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// The version before.
    pub from: u32,
    /// The version after.
    pub to: u32,
    /// P.
    pub partitions: u32,
}

/// Applies the migrations `names`'s tables are missing, in one transaction
/// under a transaction-level advisory lock (so concurrent callers apply
/// each once), with P = `partitions` for a new table.
///
/// # Errors
/// [`SchemaError::BadPartitions`]; [`SchemaError::Partitions`] when the
/// table exists with another P; [`SchemaError::Unknown`] when it is at a
/// version this crate cannot run against; [`SchemaError::Store`] when the
/// database fails (nothing is applied then).
pub async fn migrate(
    client: &mut tokio_postgres::Client,
    names: &TableNames,
    partitions: u32,
) -> Result<Migrated, SchemaError> {
    if partitions == 0 || partitions > MAX_PARTITIONS {
        return Err(SchemaError::BadPartitions(partitions));
    }
    let tx = client.transaction().await.map_err(super::pg::error)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&names.migration_lock_key()],
    )
    .await
    .map_err(super::pg::error)?;
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {} (\n    \
             version    integer     PRIMARY KEY,\n    \
             name       text        NOT NULL,\n    \
             min_reader integer     NOT NULL,\n    \
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),\n    \
             applied_by text        NOT NULL\n\
         )",
        names.schema
    ))
    .await
    .map_err(super::pg::error)?;
    let before = read_schema(&tx, names).await?;
    if before.version > 0 && before.partitions != partitions {
        return Err(SchemaError::Partitions {
            table: before.partitions,
            asked: partitions,
        });
    }
    check_known(&before)?;
    for m in MIGRATIONS.iter().filter(|m| m.version > before.version) {
        tx.batch_execute(&names.render(m.sql, partitions))
            .await
            .map_err(super::pg::error)?;
        let by = concat!("outbox ", env!("CARGO_PKG_VERSION"));
        tx.execute(
            &format!(
                "INSERT INTO {} (version, name, min_reader, applied_by) VALUES ($1, $2, $3, $4)",
                names.schema
            ),
            &[&(m.version as i32), &m.name, &(m.min_reader as i32), &by],
        )
        .await
        .map_err(super::pg::error)?;
    }
    tx.commit().await.map_err(super::pg::error)?;
    Ok(Migrated {
        from: before.version,
        to: before.version.max(SCHEMA_VERSION),
        partitions,
    })
}

fn check_known(schema: &SchemaInfo) -> Result<(), SchemaError> {
    match check(schema) {
        Err(SchemaError::Behind { .. }) => Ok(()),
        other => other,
    }
}

/// The schema of `names`'s tables: version 0 (and P 0) when none is
/// recorded.
pub(crate) async fn read_schema(
    client: &impl GenericClient,
    names: &TableNames,
) -> Result<SchemaInfo, StoreError> {
    let row = client
        .query_opt(
            &format!(
                "SELECT version, min_reader FROM {} ORDER BY version DESC LIMIT 1",
                names.schema
            ),
            &[],
        )
        .await
        .map_err(super::pg::error)?;
    let Some(row) = row else {
        return Ok(SchemaInfo {
            version: 0,
            min_reader: 0,
            partitions: 0,
        });
    };
    let version: i32 = row.get(0);
    let min_reader: i32 = row.get(1);
    let p: i32 = client
        .query_one(&format!("SELECT {}()", names.partitions_fn), &[])
        .await
        .map_err(super::pg::error)?
        .get(0);
    Ok(SchemaInfo {
        version: u32::try_from(version).unwrap_or(0),
        min_reader: u32::try_from(min_reader).unwrap_or(0),
        partitions: u32::try_from(p).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
            assert!(m.min_reader <= m.version);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn versions_known_newer_additive_and_unknown() {
        let at = |version, min_reader| SchemaInfo {
            version,
            min_reader,
            partitions: 8,
        };
        assert!(check(&at(SCHEMA_VERSION, 1)).is_ok());
        assert!(check(&at(SCHEMA_VERSION + 1, SCHEMA_VERSION)).is_ok());
        assert!(matches!(
            check(&at(SCHEMA_VERSION + 1, SCHEMA_VERSION + 1)),
            Err(SchemaError::Unknown { .. })
        ));
        assert!(matches!(check(&at(0, 0)), Err(SchemaError::Behind { .. })));
    }

    #[test]
    fn every_token_is_replaced() {
        let names = TableNames::new("s.t").unwrap();
        for m in MIGRATIONS {
            let sql = names.render(m.sql, 8);
            assert!(!sql.contains("{outbox}") && !sql.contains('{'), "{sql}");
        }
    }
}
