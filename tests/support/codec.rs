//! A test codec for `u32` items: the default codec, except for the items
//! its rules pick out (refused, panicking, padded). Shared by the journal
//! tests that need a codec to fail in known places.

use outbox::journal::{Codec, Postcard};
use outbox::{BoxError, TenantId};

/// The default codec, except: items for which `refuse` holds are refused
/// (`encode_failed`), those for which `panic` holds panic in the codec
/// (contained: `encode_failed`), and each item gets `pad(item)` bytes of
/// padding after its own (a record that fills a small buffer, or passes the
/// size limit); decoding reads the item and ignores the padding.
#[derive(Clone, Copy)]
pub struct Picky {
    pub refuse: fn(u32) -> bool,
    pub panic: fn(u32) -> bool,
    pub pad: fn(u32) -> usize,
}

impl Picky {
    /// Refuses items divisible by 13, panics on items divisible by 17.
    pub fn thirteen_seventeen() -> Self {
        Picky {
            refuse: |i| i % 13 == 0,
            panic: |i| i % 17 == 0,
            pad: |_| 0,
        }
    }
}

impl Codec<TenantId, u32> for Picky {
    fn encode_tenant(&self, t: &TenantId, out: &mut Vec<u8>) -> Result<(), BoxError> {
        Codec::<TenantId, u32>::encode_tenant(&Postcard, t, out)
    }
    fn decode_tenant(&self, b: &[u8]) -> Result<TenantId, BoxError> {
        Codec::<TenantId, u32>::decode_tenant(&Postcard, b)
    }
    fn encode_item(&self, i: &u32, out: &mut Vec<u8>) -> Result<(), BoxError> {
        assert!(!(self.panic)(*i), "test codec: panics on item {i}");
        if (self.refuse)(*i) {
            return Err("test codec: refused".into());
        }
        Codec::<TenantId, u32>::encode_item(&Postcard, i, out)?;
        out.resize(out.len() + (self.pad)(*i), 0xAB);
        Ok(())
    }
    fn decode_item(&self, b: &[u8]) -> Result<u32, BoxError> {
        postcard::take_from_bytes::<u32>(b)
            .map(|(i, _)| i)
            .map_err(Into::into)
    }
}
