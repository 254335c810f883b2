//! The crash world's checks, by the contract's rule ids (docs/contract.md,
//! D1-D6), one file per rule. Where each is checked:
//!
//! | rule | function | when |
//! | --- | --- | --- |
//! | D1 | [`d1::synced_items_written`] | at the end |
//! | D2 | [`d2::tenant_order_kept`] | each commit of the datastore (first commits of items) |
//! | D3 | [`d3::nothing_invented`] | each commit of the datastore |
//! | D4 | [`d4::recovered_counted`] | each sync answer and the final settle (the app) |
//! | D4 | [`d4::settled_accounting`] | the final settle (the app) |
//! | D4 | [`d4::recovery_bounded`] | each recovery (the app) |
//! | D4 | a rotten record's item never reaches the sink again (`CrashSink`) | each write |
//! | D1 | a synced item may be missing only when a rotten byte hit its record ([`d1::synced_items_written`]) | at the end |
//! | D5 | [`d5::settled_in_bound`]; the journal opens once the faults stop (`app`); the run's time cap (`world`) | healed phase |
//! | D6 | [`d6::disk_use_small`] | after the final settle, and after the final shutdown (the app) |
//! | S-J10 | [`s_j10::bound_held`] | each answered sync while writes cannot fail, and after the final settle (the app) |
//! | S-J17 | [`s_j17::poisoned_only_after_its_crashes`]; D1 spares a poisoned item | at the end |
//! | S-J14 | [`s_j14::refused_as_told`]: items of another codec version counted lost under `other_version` between what the recovery must and may refuse; under `Hand` exactly the records handed over | each recovery (the app) |
//! | S-J14 | [`s_j14::handed_record`]: a handed record is an item staged with its version, byte for byte | each record handed over (the app) |
//! | S-J14 | [`s_j14::failed_as_told`]: under `Fail` the build error names the versions and a count in bounds, with the files unchanged | each build that fails so (the app) |
//! | S-J14 | [`s_j14::read_by_its_version`]: the sink is never handed an item of another version than its life's | each write (`CrashSink`) |
//! | S-J14 | D1 spares an item a recovery of another version may have refused | at the end |
//! | S-J16 | [`s_j16::unattempted`]: a dead letter `expired` that says `attempted: false` holds no item handed to the sink in this life, nor one with an attempt mark on disk at this life's recovery | each dead letter (the app) |
//! | S-R3 | [`s_r3::not_written_past_its_age`]: an item already `max_item_age` old at its life's recovery never reaches the sink (its age is carried across the crash) | each write (`CrashSink`) |
//! | S-R3 | [`s_r3::expired_when_old`]: an item given up `expired` is `max_item_age` old | each dead letter (the app) |
//! | S-R3 | D1 spares an item given up `expired` | at the end |
//! | I3 | [`crate::net::check::i3::counters_balance`] | each sync answer, each sample (the app) |

use crate::net::book::Book;
use crate::net::datastore::Durable;
use crate::net::protocol::WireItem;

pub mod d1;
pub mod d2;
pub mod d3;
pub mod d4;
pub mod d5;
pub mod d6;
pub mod s_j10;
pub mod s_j14;
pub mod s_j16;
pub mod s_j17;
pub mod s_r3;

pub use crate::net::check::Broken;

/// The checks of a per-item commit (the book's `on_commit` hook): D2, D3.
pub fn on_commit(book: &Book, tenant: u128, fresh: &[WireItem], store: &Durable) -> Vec<Broken> {
    let mut broken = d3::nothing_invented(book, tenant, fresh);
    if let Some(first) = fresh.first() {
        broken.extend(d2::tenant_order_kept(store, first.tenant, fresh.len()));
    }
    broken
}
