//! The names of one outbox's tables, functions and channel, derived from
//! the outbox table's name.

use crate::sinks::postgres::{quote, InvalidTableName, QualifiedName};

/// The longest table part of an outbox table's name, in bytes: the
/// derived names (`{name}_sink_epoch`, `{name}_in_flight_partition`) must
/// stay within PostgreSQL's 63.
pub const MAX_NAME_BYTES: usize = 40;

/// Every name one outbox uses, quoted for SQL, derived from the outbox
/// table's name `name` (or `schema.name`): `name` itself, `name_dead`,
/// `name_in_flight`, `name_crashes`, `name_lease`, `name_member`,
/// `name_sink_epoch`, `name_schema`, the functions `name_partition(bytea)`
/// and `name_partitions()`, and the notification channel `name`.
#[derive(Clone, Debug)]
pub struct TableNames {
    plain: String,
    base: String,
    pub(crate) outbox: String,
    pub(crate) dead: String,
    pub(crate) in_flight: String,
    pub(crate) crashes: String,
    pub(crate) lease: String,
    pub(crate) member: String,
    pub(crate) sink_epoch: String,
    pub(crate) schema: String,
    pub(crate) partition_fn: String,
    pub(crate) partitions_fn: String,
    pub(crate) channel: String,
}

impl TableNames {
    /// The names for the outbox table `name` (`name` or `schema.name`, each
    /// part an unquoted identifier: ASCII letters, digits, `_` and `$`, not
    /// starting with a digit; the table part at most [`MAX_NAME_BYTES`]).
    ///
    /// # Errors
    /// [`InvalidTableName`] for a name outside that grammar.
    pub fn new(name: &str) -> Result<Self, InvalidTableName> {
        let parsed = QualifiedName::parse(name)?;
        let base = parsed.name().to_owned();
        if base.len() > MAX_NAME_BYTES {
            return Err(InvalidTableName::for_name(name));
        }
        let prefix = match parsed.plain.rsplit_once('.') {
            Some((schema, _)) => format!("{}.", quote(schema)),
            None => String::new(),
        };
        let q = |suffix: &str| format!("{prefix}{}", quote(&format!("{base}{suffix}")));
        Ok(TableNames {
            plain: parsed.plain.clone(),
            outbox: parsed.quoted.clone(),
            dead: q("_dead"),
            in_flight: q("_in_flight"),
            crashes: q("_crashes"),
            lease: q("_lease"),
            member: q("_member"),
            sink_epoch: q("_sink_epoch"),
            schema: q("_schema"),
            partition_fn: q("_partition"),
            partitions_fn: q("_partitions"),
            channel: quote(&parsed.plain),
            base,
        })
    }

    /// The outbox table's name as given (`name` or `schema.name`).
    pub fn name(&self) -> &str {
        &self.plain
    }

    /// The outbox table, quoted.
    pub fn outbox(&self) -> &str {
        &self.outbox
    }

    /// The dead-letter table, quoted.
    pub fn dead(&self) -> &str {
        &self.dead
    }

    /// The lease table, quoted.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// The sink's epoch table, quoted.
    pub fn sink_epoch(&self) -> &str {
        &self.sink_epoch
    }

    /// The schema-version table, quoted.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The notification channel, quoted (for `LISTEN` and `NOTIFY`).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The channel's name as `pg_notify` takes it (unquoted).
    pub fn channel_name(&self) -> &str {
        &self.plain
    }

    /// The advisory-lock key migrations of this outbox take: the first 8
    /// bytes of the md5 of `outbox.migrate:` and the name, as an `i64`.
    pub fn migration_lock_key(&self) -> i64 {
        let digest = md5_of(format!("outbox.migrate:{}", self.plain).as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        i64::from_be_bytes(first)
    }

    /// `sql` with every `{token}` of the migrations replaced by this
    /// outbox's names, and `{partitions}` by `partitions`.
    pub(crate) fn render(&self, sql: &str, partitions: u32) -> String {
        let pairs: [(&str, &str); 11] = [
            ("{outbox}", &self.outbox),
            ("{dead}", &self.dead),
            ("{in_flight}", &self.in_flight),
            ("{crashes}", &self.crashes),
            ("{lease}", &self.lease),
            ("{member}", &self.member),
            ("{sink_epoch}", &self.sink_epoch),
            ("{schema_table}", &self.schema),
            ("{partitions_fn}", &self.partitions_fn),
            ("{partition_fn}", &self.partition_fn),
            ("{base}", &self.base),
        ];
        let mut out = sql.replace("{partitions}", &partitions.to_string());
        for (token, name) in pairs {
            out = out.replace(token, name);
        }
        out
    }
}

pub(crate) fn md5_of(bytes: &[u8]) -> [u8; 16] {
    use md5::Digest;
    md5::Md5::digest(bytes).into()
}

/// The partition of a tenant whose encoded bytes are `tenant`, among
/// `partitions` (P): the first 4 bytes of the md5 of the bytes, as an
/// unsigned big-endian number, modulo P; the same as the SQL function the
/// migration creates (`{name}_partition(bytea)`, S-T4). `partitions` 0 is
/// taken as 1.
pub fn partition_of(tenant: &[u8], partitions: u32) -> u32 {
    let digest = md5_of(tenant);
    let head = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    head % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_table_and_keep_the_schema() {
        let n = TableNames::new("billing.usage_outbox").unwrap();
        assert_eq!(n.outbox(), "\"billing\".\"usage_outbox\"");
        assert_eq!(n.dead(), "\"billing\".\"usage_outbox_dead\"");
        assert_eq!(n.lease(), "\"billing\".\"usage_outbox_lease\"");
        assert_eq!(n.channel(), "\"billing.usage_outbox\"");
        assert_eq!(n.channel_name(), "billing.usage_outbox");
        let sql = n.render("CREATE INDEX \"{base}_read\" ON {outbox} ({partitions})", 8);
        assert_eq!(
            sql,
            "CREATE INDEX \"usage_outbox_read\" ON \"billing\".\"usage_outbox\" (8)"
        );
    }

    #[test]
    fn long_and_bad_names_are_refused() {
        assert!(TableNames::new(&"x".repeat(MAX_NAME_BYTES)).is_ok());
        assert!(TableNames::new(&"x".repeat(MAX_NAME_BYTES + 1)).is_err());
        for bad in ["", "a b", "a;b", "1a", "a.b.c", "a\"b"] {
            assert!(TableNames::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn partitions_follow_the_md5_of_the_tenant() {
        // md5("") = d41d8cd9...: 0xd41d8cd9 = 3558706393.
        assert_eq!(partition_of(b"", u32::MAX), 3_558_706_393);
        assert_eq!(partition_of(b"", 64), (3_558_706_393u64 % 64) as u32);
        assert_eq!(partition_of(b"anything", 0), 0);
        assert_eq!(partition_of(b"anything", 1), 0);
    }
}
