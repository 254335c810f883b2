-- outbox table, migration 1: the outbox table, its partition function, the
-- dead-letter table, the in-flight and crash records (poison detection),
-- the lease and member tables (one owner per partition) and the sink's
-- epoch table. Tokens in braces are replaced by the quoted names of one
-- outbox's tables before this runs; {partitions} is P, fixed here.

-- P, the number of partitions: changing it is an offline procedure
-- (docs/table.md, "Changing P").
CREATE FUNCTION {partitions_fn}() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT {partitions} $$;

-- A tenant's partition: the first 4 bytes of the md5 of its encoded bytes,
-- as an unsigned big-endian number, modulo P. md5 is the same on every
-- server version and platform, and the crate computes the same function
-- (outbox::table::partition_of).
CREATE FUNCTION {partition_fn}(tenant bytea) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT ((('x' || substr(md5(tenant), 1, 8))::bit(32)::bigint) % {partitions})::integer $$;

-- One row per staged item. xid is the staging transaction's id (64 bits,
-- never wraps): the relay reads only rows of transactions older than its
-- snapshot's xmin, in (xid, id) order (S-T5). staged_at is now(): the
-- staging transaction's start.
CREATE TABLE {outbox} (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    xid           xid8        NOT NULL DEFAULT pg_current_xact_id(),
    partition     integer     NOT NULL,
    tenant        bytea       NOT NULL,
    item          bytea       NOT NULL,
    codec_version bigint      NOT NULL CHECK (codec_version BETWEEN 0 AND 4294967295),
    staged_at     timestamptz NOT NULL DEFAULT now()
) WITH (
    -- A queue: rows are inserted and deleted, never updated. Vacuum after
    -- a fixed number of dead rows, not a share of a table whose size swings
    -- (the default 20% lets a drained table carry millions of dead rows).
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0
);

-- The relay's read: per partition, from its cursor on, in (xid, id) order;
-- the deleted head lies before the cursor and is never scanned.
CREATE INDEX "{base}_read" ON {outbox} (partition, xid, id);
-- A saturated tenant's catch-up read (S-T9).
CREATE INDEX "{base}_tenant" ON {outbox} (tenant, xid, id);

-- Items given up by policy, with their reason and attempts (S-T13).
CREATE TABLE {dead} (
    id            bigint      PRIMARY KEY,
    xid           xid8        NOT NULL,
    partition     integer     NOT NULL,
    tenant        bytea       NOT NULL,
    item          bytea       NOT NULL,
    codec_version bigint      NOT NULL,
    staged_at     timestamptz NOT NULL,
    reason        text        NOT NULL,
    attempts      integer     NOT NULL,
    crashes       integer     NOT NULL,
    detail        text,
    epoch         bigint      NOT NULL,
    dead_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX "{base}_dead_at" ON {dead} (dead_at);
CREATE INDEX "{base}_dead_tenant" ON {dead} (tenant, id);

-- One record per write of relayed rows, written before its first attempt
-- and gone with its rows; one left behind by an owner that did not
-- release the partition is a crash of that write (S-T17).
CREATE TABLE {in_flight} (
    first_id  bigint  PRIMARY KEY,
    partition integer NOT NULL,
    ids       bigint[] NOT NULL,
    epoch     bigint  NOT NULL
);
CREATE INDEX "{base}_in_flight_partition" ON {in_flight} (partition);

-- Crashed attempts per row (rare: only rows that were in flight when an
-- owner vanished).
CREATE TABLE {crashes} (
    id        bigint  PRIMARY KEY,
    partition integer NOT NULL,
    crashes   integer NOT NULL
);

-- One row per partition: its owner, epoch and expiry on the database's
-- clock (S-T20). Epochs only grow.
CREATE TABLE {lease} (
    partition   integer     PRIMARY KEY,
    owner       text,
    epoch       bigint      NOT NULL DEFAULT 0,
    expiry      timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);
INSERT INTO {lease} (partition) SELECT g FROM generate_series(0, {partitions} - 1) AS g;

-- Instances announce themselves here (S-T22).
CREATE TABLE {member} (
    instance   text        PRIMARY KEY,
    first_seen timestamptz NOT NULL DEFAULT clock_timestamp(),
    expiry     timestamptz NOT NULL
);

-- The highest epoch installed at the sink per partition and who installed
-- it (S-T23, S-L11): a write of an older epoch does not commit.
CREATE TABLE {sink_epoch} (
    partition   integer PRIMARY KEY,
    epoch       bigint  NOT NULL,
    holder      text,
    incarnation bigint  NOT NULL DEFAULT 0
);
