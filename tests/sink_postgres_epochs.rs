//! Epochs at the PostgreSQL sink against a real server (S-E1..S-E7): a
//! write of an older epoch after a newer install never commits; a paused
//! zombie holding a write's shared lock delays a takeover's install by at
//! most the idle timeout, within `lock_timeout`; a group fails only its
//! stale slices; a lost COMMIT reply is retried safely (S-E9). Needs
//! `OUTBOX_TEST_POSTGRES_URL` (skipped when unset, failing when set and
//! unreachable).
#![cfg(feature = "postgres")]

mod common;

use std::time::Duration;

use common::postgres;
use common::proxy::{Mode, Proxy};
use common::servers;
use outbox::core::lease::{Holder, InstanceId};
use outbox::sinks::postgres::epochs::Installed;
use outbox::sinks::postgres::{PostgresSink, StaleEpoch};
use outbox::sinks::Envelope;
use outbox::{ErrorKind, Sink, Slice, TenantId, WriteEpoch, WriteError};
use tokio_postgres::Client;

/// The zombie's transactions sit idle this long at most.
const IDLE: Duration = Duration::from_secs(1);

struct Pg {
    admin: Client,
    proxy: Proxy,
    sink: PostgresSink<Envelope>,
    table: String,
}

async fn setup(test: &str, lock_timeout: Duration) -> Option<Pg> {
    let (admin, proxy, pool) =
        postgres::connect(test, 4, Duration::from_secs(5), Duration::from_secs(5)).await?;
    let table = servers::unique_name(test);
    let sink = PostgresSink::new(pool, &table)
        .expect("valid table name")
        .with_epochs(&format!("{table}_epoch"))
        .expect("valid epoch table name")
        .lock_timeout(lock_timeout)
        .idle_in_transaction_timeout(IDLE);
    sink.create_table().await.expect("create the tables");
    Some(Pg {
        admin,
        proxy,
        sink,
        table,
    })
}

impl Pg {
    /// The rows of `tenant`, as payloads in `seq` order.
    async fn payloads(&self, tenant: TenantId) -> Vec<Vec<u8>> {
        let sql = format!(
            "SELECT payload FROM \"{}\" WHERE tenant = $1 ORDER BY seq",
            self.table
        );
        self.admin
            .query(&sql, &[tenant.as_uuid()])
            .await
            .expect("read back")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Another sink on the same tables through a proxy of its own.
    async fn other(&self, test: &str, lock_timeout: Duration) -> (Proxy, PostgresSink<Envelope>) {
        let (_, proxy, pool) =
            postgres::connect(test, 1, Duration::from_secs(30), Duration::from_secs(30))
                .await
                .expect("set");
        let sink = PostgresSink::new(pool, &self.table)
            .expect("valid")
            .with_epochs(&format!("{}_epoch", self.table))
            .expect("valid")
            .lock_timeout(lock_timeout)
            .idle_in_transaction_timeout(IDLE);
        (proxy, sink)
    }

    async fn finish(self) {
        let t = &self.table;
        self.admin
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS \"{t}\", \"{t}_epoch\" CASCADE"
            ))
            .await
            .expect("clean up");
    }
}

fn holder(instance: &str) -> Holder {
    Holder {
        instance: InstanceId::new(instance).expect("valid"),
        incarnation: 1,
    }
}

fn env(payload: &str) -> Envelope {
    Envelope::new(payload.as_bytes().to_vec())
}

fn stale_cause(e: &WriteError) -> &StaleEpoch {
    assert_eq!(e.kind(), ErrorKind::StaleEpoch, "{e}");
    e.cause()
        .downcast_ref::<StaleEpoch>()
        .expect("a StaleEpoch")
}

/// S-E2, S-E4: once a newer epoch is installed, a write of the older one
/// commits nothing and answers `stale_epoch`, retried or not; the newer
/// owner's writes commit; a partition with no epoch installed refuses every
/// write.
#[tokio::test]
async fn s_e4_a_write_of_an_older_epoch_after_a_newer_install_never_commits() {
    let Some(pg) = setup("s_e4_older_epoch", Duration::from_secs(2)).await else {
        return;
    };
    let t = TenantId::new_v7();
    let old = WriteEpoch::new(3, 1);
    let new = WriteEpoch::new(3, 2);
    let none = pg
        .sink
        .write_with_epoch(old, &t, &[env("before any install")])
        .await
        .expect_err("no epoch installed");
    assert_eq!(stale_cause(&none).epoch, old);
    assert_eq!(
        pg.sink.install_epoch(3, 1, &holder("a")).await.unwrap(),
        Installed::Installed
    );
    pg.sink
        .write_with_epoch(old, &t, &[env("a1"), env("a2")])
        .await
        .expect("the installed epoch commits");
    assert_eq!(
        pg.sink.install_epoch(3, 2, &holder("b")).await.unwrap(),
        Installed::Installed
    );
    let zombie = [env("z1")];
    for _ in 0..2 {
        let e = pg
            .sink
            .write_with_epoch(old, &t, &zombie)
            .await
            .expect_err("stale");
        assert_eq!(stale_cause(&e).epoch, old);
    }
    pg.sink
        .write_with_epoch(new, &t, &[env("b1")])
        .await
        .expect("the new owner commits");
    assert_eq!(
        pg.payloads(t).await,
        [b"a1".to_vec(), b"a2".to_vec(), b"b1".to_vec()]
    );
    // A rival of the same epoch is superseded and changes nothing.
    assert_eq!(
        pg.sink.install_epoch(3, 2, &holder("c")).await.unwrap(),
        Installed::Superseded { current: 2 }
    );
    let rows = pg.sink.sink_epochs().await.unwrap();
    assert_eq!(
        (rows[0].partition, rows[0].epoch, rows[0].holder.as_deref()),
        (3, 2, Some("b"))
    );
    pg.finish().await;
}

/// S-E4, S-F3: a group checked by epochs fails only the slices of its
/// stale partitions; the others commit, in one transaction without them.
#[tokio::test]
async fn s_e4_a_group_fails_only_its_stale_slices() {
    let Some(pg) = setup("s_e4_group", Duration::from_secs(2)).await else {
        return;
    };
    for p in [1, 2, 5] {
        pg.sink.install_epoch(p, 4, &holder("a")).await.unwrap();
    }
    pg.sink.install_epoch(2, 5, &holder("b")).await.unwrap();
    let ts: Vec<TenantId> = (0..4).map(|_| TenantId::new_v7()).collect();
    let slices: Vec<Slice<TenantId, Envelope>> = ts
        .iter()
        .enumerate()
        .map(|(i, t)| Slice::new(*t, vec![env(&format!("s{i}"))]))
        .collect();
    // Partition 2's epoch is stale; 1 and 5 hold; the last slice names
    // partition 5 in the wrong order (order is the sink's business).
    let epochs = [
        WriteEpoch::new(5, 4),
        WriteEpoch::new(2, 4),
        WriteEpoch::new(1, 4),
        WriteEpoch::new(5, 4),
    ];
    let out = pg.sink.write_group_with_epochs(&slices, &epochs).await;
    assert!(
        out[0].is_ok() && out[2].is_ok() && out[3].is_ok(),
        "{out:?}"
    );
    let e = out[1].as_ref().expect_err("partition 2 is stale");
    assert_eq!(stale_cause(e).epoch, WriteEpoch::new(2, 4));
    for (i, t) in ts.iter().enumerate() {
        let want: Vec<Vec<u8>> = if i == 1 {
            vec![]
        } else {
            vec![format!("s{i}").into_bytes()]
        };
        assert_eq!(pg.payloads(*t).await, want, "slice {i}");
    }
    pg.finish().await;
}

/// Waits until some session holds a `FOR SHARE` lock (`RowShareLock`) on
/// `table`: the zombie's check ran.
async fn share_locked(admin: &Client, table: &str) {
    servers::eventually("the zombie's check", Duration::from_secs(20), || async {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 WHERE c.relname = $1 AND l.mode = 'RowShareLock' AND l.granted",
                &[&table],
            )
            .await
            .expect("pg_locks")
            .get(0);
        (n > 0).then_some(())
    })
    .await;
}

/// S-E5: a zombie whose write holds the epoch row's shared lock and then
/// stalls before its COMMIT (every packet of its connection held well past
/// the idle timeout) delays a takeover's install by at most the server's
/// idle timeout: an install with a `lock_timeout` below it fails
/// (`55P03`), one with a `lock_timeout` above it succeeds while the zombie
/// is still stalled; the zombie's write never commits.
#[tokio::test]
async fn s_e5_a_paused_zombie_delays_a_takeover_by_at_most_its_timeout() {
    let test = "s_e5_paused_zombie";
    let Some(pg) = setup(test, Duration::from_secs(2)).await else {
        return;
    };
    let (zombie_proxy, zombie) = pg.other(test, Duration::from_secs(2)).await;
    let (_p1, quick) = pg.other(test, Duration::from_millis(100)).await;
    let (_p2, patient) = pg.other(test, Duration::from_secs(10)).await;
    // Every pool holds a connection before the zombie's is slowed.
    zombie.install_epoch(0, 1, &holder("zombie")).await.unwrap();
    quick.sink_epochs().await.unwrap();
    patient.sink_epochs().await.unwrap();
    let t = TenantId::new_v7();
    // The zombie pauses once its check has run (its reply, a one-row
    // SELECT, is held), before its COMMIT: idle in its transaction.
    let paused = zombie_proxy.stall_reply_on(b"SELECT 1\0");
    let z = tokio::spawn(async move {
        zombie
            .write_with_epoch(WriteEpoch::new(0, 1), &t, &[env("zombie")])
            .await
    });
    paused.fired(Duration::from_secs(20)).await;
    share_locked(&pg.admin, &format!("{}_epoch", pg.table)).await;
    let refused = quick
        .install_epoch(0, 2, &holder("taker"))
        .await
        .expect_err("held by the zombie's shared lock");
    let sqlstate = refused
        .cause()
        .downcast_ref::<outbox::sinks::postgres::PostgresError>()
        .and_then(|e| e.0.code().map(|c| c.code().to_owned()));
    assert_eq!(sqlstate.as_deref(), Some("55P03"), "{refused}");
    assert_eq!(
        patient.install_epoch(0, 2, &holder("taker")).await.unwrap(),
        Installed::Installed,
        "the server ended the idle zombie within the lock timeout"
    );
    // The zombie wakes up: its COMMIT meets a session the server ended.
    zombie_proxy.set_mode(Mode::Pass);
    let err = z
        .await
        .expect("the zombie's task")
        .expect_err("the zombie never commits");
    assert_ne!(err.kind(), ErrorKind::Terminal, "{err}");
    assert!(pg.payloads(t).await.is_empty(), "nothing of the zombie");
    pg.finish().await;
}

/// S-E9: a checked write whose COMMIT reply is lost committed; its retry
/// under the same epoch commits again, absorbed by the key (one copy);
/// once a newer epoch is installed, the retry is refused as stale and the
/// first attempt's rows stay, before the new owner's.
#[tokio::test]
async fn s_e9_a_commit_whose_reply_is_lost_under_an_epoch() {
    let Some(pg) = setup("s_e9_lost_commit", Duration::from_secs(2)).await else {
        return;
    };
    pg.sink.install_epoch(6, 1, &holder("a")).await.unwrap();
    let t = TenantId::new_v7();
    let items = [env("x1"), env("x2")];
    let epoch = WriteEpoch::new(6, 1);
    let cut = pg.proxy.cut_reply_on(b"COMMIT\0");
    let lost = pg.sink.write_with_epoch(epoch, &t, &items).await;
    cut.fired(Duration::from_secs(10)).await;
    let e = lost.expect_err("the reply is lost");
    assert_eq!(e.kind(), ErrorKind::Retryable, "{e}");
    assert_eq!(pg.payloads(t).await.len(), 2, "it committed");
    // A pooled connection may fail once more before the pool drops it.
    let mut again = pg.sink.write_with_epoch(epoch, &t, &items).await;
    if again
        .as_ref()
        .is_err_and(|e| e.kind() == ErrorKind::Retryable)
    {
        again = pg.sink.write_with_epoch(epoch, &t, &items).await;
    }
    again.expect("the retry commits");
    assert_eq!(pg.payloads(t).await.len(), 2, "one copy");
    pg.sink.install_epoch(6, 2, &holder("b")).await.unwrap();
    let e = pg
        .sink
        .write_with_epoch(epoch, &t, &items)
        .await
        .expect_err("stale now");
    assert_eq!(stale_cause(&e).epoch, epoch);
    pg.sink
        .write_with_epoch(WriteEpoch::new(6, 2), &t, &[env("y")])
        .await
        .unwrap();
    assert_eq!(
        pg.payloads(t).await,
        [b"x1".to_vec(), b"x2".to_vec(), b"y".to_vec()]
    );
    pg.finish().await;
}
