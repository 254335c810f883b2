//! S-J12, schema identity (issue 25): a changed item type is never misread
//! silently. Items journaled as `(u32, u32)` and recovered by an outbox of
//! `u32` were written as their first fields, the second dropped, nothing
//! counted: the postcard decoder accepted trailing bytes.
#![cfg(feature = "journal")]

mod support;

use outbox::journal::format::EncodedItem;
use outbox::journal::{Codec, MemStorage, Postcard};
use support::hand::{limits, Hand};

#[test]
fn items_of_a_wider_type_are_counted_unreadable_not_misread() {
    let disk = MemStorage::new();
    let (mut j, _) = Hand::<u8, _>::open::<(u32, u32), _>(disk.clone(), &Postcard, limits(4_096))
        .expect("opens");
    j.round().unwrap();
    for n in 0..5u32 {
        let item = (n, 1_000 + n);
        let record = EncodedItem::new(
            |b| Codec::<u8, (u32, u32)>::encode_tenant(&Postcard, &1, b),
            |b| Codec::<u8, (u32, u32)>::encode_item(&Postcard, &item, b),
        )
        .map_err(|_| ())
        .unwrap();
        assert!(j.append(1, &record));
    }
    j.round().unwrap();
    drop(j);
    disk.crash();
    let (_, back) =
        Hand::<u8, _>::open::<u32, _>(disk.clone(), &Postcard, limits(4_096)).expect("opens");
    let misread: Vec<u32> = back.items.iter().map(|x| x.2).collect();
    assert!(misread.is_empty(), "read as the first fields: {misread:?}");
    assert_eq!(back.report.unreadable, 5);
    // The right type still reads them.
    let (_, back) =
        Hand::<u8, _>::open::<(u32, u32), _>(disk, &Postcard, limits(4_096)).expect("opens");
    assert_eq!(back.items.len(), 5);
}
