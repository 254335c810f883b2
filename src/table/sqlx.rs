//! Staging in sqlx's PostgreSQL transaction (feature `sqlx`, S-T10): the
//! same statements as the tokio-postgres calls.

use super::stage::{OutboxTable, StageError};
use crate::codec::Codec;
use crate::core::relay::{StoreError, StoreErrorKind};

/// The sqlx crate these calls are built on, re-exported so the versions
/// match.
pub use ::sqlx as sqlx_crate;

fn db_error(e: ::sqlx::Error) -> StageError {
    let (kind, code) = match &e {
        ::sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned());
            let kind = match code.as_deref() {
                Some("55P03") => StoreErrorKind::LockTimeout,
                Some(c) if c.starts_with("40") => StoreErrorKind::Conflict,
                _ => StoreErrorKind::Refused,
            };
            (kind, code)
        }
        ::sqlx::Error::PoolTimedOut | ::sqlx::Error::PoolClosed => {
            (StoreErrorKind::Unavailable, None)
        }
        _ => (StoreErrorKind::Unknown, None),
    };
    StageError::Database(StoreError::new(kind, code, e))
}

impl<K, I, C: Codec<K, I>> OutboxTable<K, I, C> {
    /// [`stage`](Self::stage) on a sqlx PostgreSQL connection or
    /// transaction (`&mut *tx` for a `sqlx::Transaction<'_, Postgres>`).
    ///
    /// # Errors
    /// As [`stage`](Self::stage).
    pub async fn stage_sqlx(
        &self,
        conn: &mut ::sqlx::PgConnection,
        tenant: &K,
        item: &I,
    ) -> Result<i64, StageError> {
        let (t, i) = self
            .encode(tenant, item)
            .map_err(|source| StageError::Unencodable { index: 0, source })?;
        let (id,): (i64,) = ::sqlx::query_as(self.one_sql())
            .bind(t)
            .bind(i)
            .bind(i64::from(self.version()))
            .fetch_one(conn)
            .await
            .map_err(db_error)?;
        Ok(id)
    }

    /// [`stage_run`](Self::stage_run) on a sqlx PostgreSQL connection or
    /// transaction.
    ///
    /// # Errors
    /// As [`stage`](Self::stage).
    pub async fn stage_run_sqlx<'a>(
        &self,
        conn: &mut ::sqlx::PgConnection,
        items: impl IntoIterator<Item = (&'a K, &'a I)>,
    ) -> Result<u64, StageError>
    where
        K: 'a,
        I: 'a,
    {
        let (tenants, encoded) = self.encode_run(items)?;
        if tenants.is_empty() {
            return Ok(0);
        }
        let (n,): (i64,) = ::sqlx::query_as(self.run_sql())
            .bind(tenants)
            .bind(encoded)
            .bind(i64::from(self.version()))
            .fetch_one(conn)
            .await
            .map_err(db_error)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
