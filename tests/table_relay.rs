//! The outbox table relayed by an outbox (S-T30..S-T36), against the real
//! PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`: skipped when unset, failing
//! when set and unreachable). Each test has tables of its own.
#![cfg(all(feature = "table", feature = "testkit"))]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::servers;
use common::table::{Faulty, Usage, World};
use outbox::codec::{Codec, Postcard};
use outbox::table::TableRelay;
use outbox::{Config, WriteError};

/// Waits for the tasks of a shut-down outbox to end (its last handle
/// dropped first: `closed` waits for that too).
async fn close<S: outbox::Sink>(outbox: outbox::Outbox<S>) {
    let closed = outbox.closed();
    drop(outbox);
    closed.await;
}

fn config() -> Config {
    Config::builder().max_batch(50).build().expect("config")
}

/// S-T10, S-T31: a rolled-back stage is never delivered; a committed one
/// is, once, and its row is deleted.
#[tokio::test]
async fn a_rolled_back_stage_is_never_delivered_a_committed_one_once() {
    let Some(w) = World::new("rolled_back").await else {
        return;
    };
    let outbox = w.outbox(config(), TableRelay::new("i1"));
    w.stage(7, &[Usage::new(1)], false).await;
    w.stage(7, &[Usage::new(2)], true).await;
    w.stage(8, &[Usage::new(3)], false).await;
    w.stage(8, &[Usage::new(4)], true).await;
    let rows = w.wait_for(2).await;
    let report = outbox.shutdown(Duration::from_secs(5)).await;
    let written = outbox.counters().written;
    close(outbox).await;
    let mut ids: Vec<u128> = w.target_rows().await.iter().map(|r| r.1).collect();
    ids.sort_unstable();
    assert_eq!(ids, [2, 4], "rows {rows:?}, report {report:?}");
    assert_eq!(w.left().await, 0, "every delivered row is deleted");
    assert_eq!(written, 2);
    w.finish().await;
}

/// S-T13, S-T31: a slice the sink rejects ends in the dead-letter table
/// with its reason; its healthy neighbours, of its tenant (staged before
/// and after it, one in its transaction) and of other tenants, are
/// written, in order, and none is dead-lettered.
#[tokio::test]
async fn a_rejected_item_is_dead_lettered_and_its_neighbours_are_not() {
    let Some(w) = World::new("dead_letter").await else {
        return;
    };
    let sink = Faulty {
        inner: w.sink(),
        fault: Box::new(|_, item| (item.id == 666).then(|| WriteError::terminal("poison"))),
    };
    let config = Config::builder().max_batch(1).build().expect("config");
    let outbox = w.outbox_into(sink, config, TableRelay::new("i1"));
    for id in [1, 2] {
        w.stage(5, &[Usage::new(id)], true).await;
    }
    w.stage(5, &[Usage::new(666), Usage::new(3)], true).await;
    w.stage(6, &[Usage::new(10), Usage::new(11)], true).await;
    w.stage(5, &[Usage::new(4)], true).await;
    w.stage(7, &[Usage::new(20)], true).await;
    let rows = w.wait_for(7).await;
    let dead = servers::eventually("the dead letter", Duration::from_secs(20), || async {
        let dead = w.dead().await;
        (!dead.is_empty()).then_some(dead)
    })
    .await;
    drop(outbox.shutdown(Duration::from_secs(5)).await);
    close(outbox).await;
    let of = |t: i64| -> Vec<u128> { rows.iter().filter(|r| r.0 == t).map(|r| r.1).collect() };
    assert_eq!(of(5), [1, 2, 3, 4], "its tenant's neighbours, in order");
    assert_eq!((of(6), of(7)), (vec![10, 11], vec![20]), "other tenants'");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1, "terminal");
    let item: Usage = Codec::<u64, Usage>::decode_item(&Postcard, &dead[0].0).expect("the item");
    assert_eq!(item.id, 666);
    assert_eq!(w.left().await, 0);
    w.finish().await;
}

/// S-W8, S-T9, S-T35: a tenant whose writes always fail holds its share of
/// the read-ahead and no more; every other tenant is delivered.
#[tokio::test]
async fn a_tenant_whose_writes_always_fail_delays_no_other() {
    let Some(w) = World::new("failing_tenant").await else {
        return;
    };
    let sink = Faulty {
        inner: w.sink(),
        fault: Box::new(|tenant, _| (tenant == 13).then(|| WriteError::retryable("down"))),
    };
    let config = Config::builder()
        .max_batch(10)
        .capacity(100)
        .tenant_capacity(5)
        .initial_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(50))
        .build()
        .expect("config");
    let outbox = w.outbox_into(sink, config, TableRelay::new("i1"));
    let failing: Vec<Usage> = (1000..1040).map(Usage::new).collect();
    w.stage(13, &failing, true).await;
    for tenant in 1..=4u64 {
        let items: Vec<Usage> = (0..10)
            .map(|i| Usage::new(u128::from(tenant) * 100 + i))
            .collect();
        w.stage(tenant, &items, true).await;
    }
    let rows = w.wait_for(40).await;
    drop(outbox.shutdown(Duration::from_millis(500)).await);
    close(outbox).await;
    assert!(
        rows.iter().all(|r| r.0 != 13),
        "nothing of the failing tenant is written"
    );
    assert_eq!(
        w.left().await,
        40,
        "its rows stay in the table, handed over"
    );
    w.finish().await;
}

/// One committed stage: when its first statement was sent and when its
/// COMMIT was acknowledged.
#[derive(Clone, Debug)]
struct Committed {
    tenant: u64,
    id: u128,
    first_sent: Instant,
    acked: Instant,
}

/// What the stagers did.
#[derive(Default)]
struct Staging {
    committed: Vec<Committed>,
    rolled_back: Vec<u128>,
}

/// The order rule's check (S-T5, S-T6): every committed row delivered,
/// no rolled-back one, and for two rows of one tenant where the second's
/// first statement was sent after the first's COMMIT was acknowledged,
/// the first delivered before the second.
fn check(staging: &Staging, target: &[(i64, u128)]) -> Result<(), String> {
    let mut at = BTreeMap::new();
    for (i, (_, id)) in target.iter().enumerate() {
        if at.insert(*id, i).is_some() {
            return Err(format!("{id} delivered twice"));
        }
    }
    for id in &staging.rolled_back {
        if at.contains_key(id) {
            return Err(format!("rolled-back {id} delivered"));
        }
    }
    for c in &staging.committed {
        if !at.contains_key(&c.id) {
            return Err(format!("committed {} never delivered", c.id));
        }
    }
    for a in &staging.committed {
        for b in &staging.committed {
            if a.tenant == b.tenant && b.first_sent > a.acked && at[&b.id] < at[&a.id] {
                return Err(format!(
                    "{} delivered before {}, which committed before it began",
                    b.id, a.id
                ));
            }
        }
    }
    Ok(())
}

/// Stages with 8 concurrent stagers over 3 tenants, some transactions
/// long and some rolled back; one long transaction of tenant 0 waits
/// (at most 1 s) for a later row of its tenant to be delivered before it
/// commits, which a reader of "ids above the last seen" skips for good.
async fn stage_concurrently(w: &Arc<World>) -> Staging {
    let staging = Arc::new(Mutex::new(Staging::default()));
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (w, staging) = (Arc::clone(w), Arc::clone(&staging));
        tasks.spawn(async move { late_committer(&w, &staging).await });
    }
    for stager in 0..8u128 {
        let (w, staging) = (Arc::clone(w), Arc::clone(&staging));
        tasks.spawn(async move {
            for j in 0..12u128 {
                let id = 10_000 + stager * 100 + j;
                let tenant = ((stager + j) % 3) as u64;
                let long = (stager + j) % 5 == 0;
                let commit = (stager * 7 + j) % 9 != 4;
                let c = stage_one(&w, tenant, id, long, commit).await;
                let mut s = staging.lock().unwrap();
                match c {
                    Some(c) => s.committed.push(c),
                    None => s.rolled_back.push(id),
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Arc::into_inner(staging)
        .expect("stagers done")
        .into_inner()
        .unwrap()
}

/// One transaction staging one row; `None` if rolled back.
async fn stage_one(
    w: &World,
    tenant: u64,
    id: u128,
    long: bool,
    commit: bool,
) -> Option<Committed> {
    let mut client = w.pool.get().await.expect("a connection");
    let tx = tokio_postgres::Client::transaction(&mut client)
        .await
        .expect("begin");
    let first_sent = Instant::now();
    w.table
        .stage(&tx, &tenant, &Usage::new(id))
        .await
        .expect("stage");
    if long {
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    if !commit {
        tx.rollback().await.expect("rollback");
        return None;
    }
    tx.commit().await.expect("commit");
    let acked = Instant::now();
    Some(Committed {
        tenant,
        id,
        first_sent,
        acked,
    })
}

async fn late_committer(w: &World, staging: &Mutex<Staging>) {
    let mut client = w.pool.get().await.expect("a connection");
    let tx = tokio_postgres::Client::transaction(&mut client)
        .await
        .expect("begin");
    let first_sent = Instant::now();
    w.table.stage(&tx, &0, &Usage::new(1)).await.expect("stage");
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        let rows = w.target_rows().await;
        if rows.iter().any(|r| r.0 == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.commit().await.expect("commit");
    let acked = Instant::now();
    staging.lock().unwrap().committed.push(Committed {
        tenant: 0,
        id: 1,
        first_sent,
        acked,
    });
}

/// Runs the concurrent stagers against a relay; waits for every committed
/// row (at most `wait`), shuts the outbox down, and checks.
async fn run_order(
    test: &str,
    relay: TableRelay<u64, Usage>,
    wait: Duration,
) -> Option<Result<(), String>> {
    let w = Arc::new(World::new(test).await?);
    let outbox = w.outbox(config(), relay);
    let staging = stage_concurrently(&w).await;
    let n = staging.committed.len();
    let until = Instant::now() + wait;
    while w.target_rows().await.len() < n && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(outbox.shutdown(Duration::from_secs(2)).await);
    close(outbox).await;
    let result = check(&staging, &w.target_rows().await);
    Arc::into_inner(w).expect("one owner").finish().await;
    Some(result)
}

/// S-T5, S-T31: causal order per tenant under concurrent stagers with
/// long transactions, every committed row exactly once, no rolled-back one.
#[tokio::test]
async fn causal_order_holds_under_concurrent_stagers_with_long_transactions() {
    let Some(result) = run_order("causal", TableRelay::new("i1"), Duration::from_secs(20)).await
    else {
        return;
    };
    result.expect("the order rule");
}

/// S-T6: the same check fails against a relay that reads "ids above the
/// last seen": the check sees the bug it exists for.
#[tokio::test]
async fn the_check_fails_against_a_reader_of_ids_above_the_last_seen() {
    let relay = TableRelay::new("i1").planted_id_above_last_seen();
    let Some(result) = run_order("planted", relay, Duration::from_secs(3)).await else {
        return;
    };
    assert!(result.is_err(), "the planted reader passed the check");
}

/// S-T15, S-T34: the relay's sessions (its pool's and its listener's)
/// terminated with `pg_terminate_backend` under load lose nothing.
#[tokio::test]
async fn terminated_relay_sessions_lose_nothing() {
    let Some(w) = World::new("terminate").await else {
        return;
    };
    let w = Arc::new(w);
    let outbox = w.outbox(config(), TableRelay::new("i1"));
    let stager = {
        let w = Arc::clone(&w);
        tokio::spawn(async move {
            for i in 0..100u128 {
                let items = [Usage::new(2 * i + 1), Usage::new(2 * i + 2)];
                w.stage((i % 5) as u64, &items, true).await;
            }
        })
    };
    let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
               WHERE application_name = $1 OR application_name = $2";
    let mut killed = 0i64;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let row = w
            .admin
            .query_one(sql, &[&w.relay_app, &w.listener_app])
            .await
            .expect("terminate");
        killed += row.get::<_, i64>(0);
    }
    stager.await.expect("the stager");
    let rows = w.wait_for(200).await;
    servers::eventually("an empty outbox table", Duration::from_secs(20), || async {
        (w.left().await == 0).then_some(())
    })
    .await;
    drop(outbox.shutdown(Duration::from_secs(2)).await);
    close(outbox).await;
    assert!(killed > 0, "no session was terminated");
    let mut ids: Vec<u128> = rows.iter().map(|r| r.1).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=200).collect::<Vec<u128>>());
    Arc::into_inner(w).expect("one owner").finish().await;
}
