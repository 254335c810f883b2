//! How the crash world's items and tenants become journal bytes: fixed
//! little-endian fields, so a record's size never depends on the item.

use outbox::journal::Codec;
use outbox::{BoxError, TenantId};

use crate::net::sink::Item;

/// The crash world's [`Codec`]: a tenant is its 16 UUID bytes; an item is
/// `id: u64`, `tenant: u32`, `size: u32` (16 bytes).
#[derive(Clone, Copy, Debug, Default)]
pub struct ItemCodec;

impl Codec<TenantId, Item> for ItemCodec {
    fn encode_tenant(&self, tenant: &TenantId, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(&tenant.as_uuid().as_u128().to_le_bytes());
        Ok(())
    }

    fn decode_tenant(&self, bytes: &[u8]) -> Result<TenantId, BoxError> {
        let b: [u8; 16] = bytes.try_into().map_err(|_| "a tenant is 16 bytes")?;
        Ok(TenantId::from_u128(u128::from_le_bytes(b)))
    }

    fn encode_item(&self, item: &Item, out: &mut Vec<u8>) -> Result<(), BoxError> {
        out.extend_from_slice(&item.id.to_le_bytes());
        out.extend_from_slice(&item.tenant.to_le_bytes());
        out.extend_from_slice(&item.size.to_le_bytes());
        Ok(())
    }

    fn decode_item(&self, bytes: &[u8]) -> Result<Item, BoxError> {
        if bytes.len() != 16 {
            return Err("an item is 16 bytes".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        Ok(Item {
            id: u64_at(0),
            tenant: u32_at(8),
            size: u32_at(12),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_and_tenants_round_trip() {
        let c = ItemCodec;
        let item = Item {
            id: 1 << 40,
            tenant: 7,
            size: 300,
        };
        let mut b = Vec::new();
        c.encode_item(&item, &mut b).unwrap();
        assert_eq!(c.decode_item(&b).unwrap(), item);
        assert!(c.decode_item(&b[1..]).is_err());
        let t = TenantId::from_u128(8);
        let mut b = Vec::new();
        c.encode_tenant(&t, &mut b).unwrap();
        assert_eq!(c.decode_tenant(&b).unwrap(), t);
        assert!(c.decode_tenant(&b[..15]).is_err());
    }
}
