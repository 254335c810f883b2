//! S-J16 (issue 25): dead letters say what may be committed. Each run of
//! `ShutdownReport::unwritten` and each run-time dead letter carries
//! `attempted`: true when an attempt of that slice started (the store may
//! hold it: a replay must be idempotent), false when none did.

mod core_world;

use core_world::World;
use outbox::core::{Config, DeadReason, Event, Failure, Outcome};

fn letters(w: &World) -> Vec<(u32, Vec<u32>, DeadReason, bool)> {
    w.events
        .iter()
        .filter_map(|e| match e {
            Event::DeadLetter(d) => Some((d.tenant, d.items.clone(), d.reason, d.attempted)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_shutdown_says_which_runs_were_attempted() {
    // Tenant 1: a write in flight (item 1) and a backlog (items 2, 3)
    // staged during it; tenant 2: a failed write backing off (item 4);
    // tenant 3: never tried (item 5, the concurrency taken).
    let mut w = World::new(Config::builder().concurrency(2));
    w.stage_ok(1, [1]);
    w.stage_ok(2, [4]);
    let writes = w.poll();
    assert_eq!(writes.len(), 2);
    let (a, b) = {
        let mut it = writes.into_iter();
        let x = it.next().unwrap();
        let y = it.next().unwrap();
        if x.tenant == 1 {
            (x, y)
        } else {
            (y, x)
        }
    };
    w.stage_ok(1, [2, 3]);
    w.fail(b);
    w.stage_ok(3, [5]);
    let sd = w.shutdown(10);
    w.at(10);
    w.finish(a, Outcome::Failed(Failure::Cancelled));
    let r = w.shutdown_done(sd).expect("answered").clone_runs();
    assert_eq!(
        r,
        [
            (1, vec![1], true),
            (1, vec![2, 3], false),
            (2, vec![4], true),
            (3, vec![5], false),
        ]
    );
}

trait Runs {
    fn clone_runs(&self) -> Vec<(u32, Vec<u32>, bool)>;
}

impl Runs for outbox::core::ShutdownReport<u32, u32> {
    fn clone_runs(&self) -> Vec<(u32, Vec<u32>, bool)> {
        self.unwritten
            .iter()
            .map(|r| (r.tenant, r.items.clone(), r.attempted))
            .collect()
    }
}

#[test]
fn run_time_dead_letters_say_whether_they_were_attempted() {
    // A terminal rejection was attempted; items expired in the backlog
    // never were; a retry slice that expires was.
    let mut w = World::new(
        Config::builder()
            .dead_letters(true)
            .max_item_age(core_world::dur(100)),
    );
    w.stage_ok(1, [1]);
    let a = w.poll_one();
    w.finish(a, Outcome::Failed(Failure::Rejected));
    w.stage_ok(2, [2]);
    let b = w.poll_one();
    w.stage_ok(3, [3]);
    w.fail(b);
    // Tenant 3's item and tenant 2's retry slice pass their age.
    w.at(150);
    let _ = w.poll();
    let got = letters(&w);
    assert!(
        got.contains(&(1, vec![1], DeadReason::Terminal, true)),
        "{got:?}"
    );
    assert!(
        got.contains(&(2, vec![2], DeadReason::Expired, true)),
        "{got:?}"
    );
    assert!(
        got.contains(&(3, vec![3], DeadReason::Expired, false)),
        "{got:?}"
    );
}
