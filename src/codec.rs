//! How tenants and items become bytes and back (S-J8): the journal's
//! records, and the rows of an outbox table, share one codec.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::sink::BoxError;

/// Encodes tenants of type `K` and items of type `I` for the journal (and
/// any other durable place an outbox keeps items), and decodes them at
/// recovery.
///
/// Encoding runs in [`stage`](crate::Outbox::stage), on the caller's
/// thread and outside the outbox's lock; it must not block. A failure (an
/// error, or a panic, which is contained) refuses the item, counted
/// dropped under `encode_failed`; a failure to decode at recovery counts
/// the item lost under `journal_unreadable` (D4). Decoding must accept
/// what encoding produced, also across versions of the program that share
/// a journal directory.
pub trait Codec<K, I>: Send + Sync + 'static {
    /// Appends `tenant`'s bytes to `out`.
    ///
    /// # Errors
    /// The tenant cannot be encoded.
    fn encode_tenant(&self, tenant: &K, out: &mut Vec<u8>) -> Result<(), BoxError>;
    /// The tenant `bytes` stand for.
    ///
    /// # Errors
    /// The bytes are not a tenant.
    fn decode_tenant(&self, bytes: &[u8]) -> Result<K, BoxError>;
    /// Appends `item`'s bytes to `out`.
    ///
    /// # Errors
    /// The item cannot be encoded.
    fn encode_item(&self, item: &I, out: &mut Vec<u8>) -> Result<(), BoxError>;
    /// The item `bytes` stand for.
    ///
    /// # Errors
    /// The bytes are not an item.
    fn decode_item(&self, bytes: &[u8]) -> Result<I, BoxError>;

    /// The version of the items' encoding, written with every record and
    /// compared at recovery (S-J14). Default 0.
    fn version(&self) -> u32 {
        0
    }

    /// The item type's name, recorded in every segment beside the version
    /// and shown by the inspector; never used to refuse (names change with
    /// a refactor, encodings need not). Default
    /// [`std::any::type_name`] of `I`.
    fn item_type(&self) -> &str {
        std::any::type_name::<I>()
    }
}

/// `codec` with version `version` (S-J14): its records say so, and a
/// recovery by a codec of another version refuses them.
///
/// ```
/// use outbox::journal::{Postcard, Versioned};
/// // The item type gained a field: older records are refused, not misread.
/// let codec = Versioned::new(Postcard, 2);
/// # let _ = codec;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Versioned<C> {
    codec: C,
    version: u32,
}

impl<C> Versioned<C> {
    /// `codec`, of version `version`.
    pub fn new(codec: C, version: u32) -> Self {
        Versioned { codec, version }
    }
}

impl<K, I, C: Codec<K, I>> Codec<K, I> for Versioned<C> {
    fn encode_tenant(&self, tenant: &K, out: &mut Vec<u8>) -> Result<(), BoxError> {
        self.codec.encode_tenant(tenant, out)
    }
    fn decode_tenant(&self, bytes: &[u8]) -> Result<K, BoxError> {
        self.codec.decode_tenant(bytes)
    }
    fn encode_item(&self, item: &I, out: &mut Vec<u8>) -> Result<(), BoxError> {
        self.codec.encode_item(item, out)
    }
    fn decode_item(&self, bytes: &[u8]) -> Result<I, BoxError> {
        self.codec.decode_item(bytes)
    }
    fn version(&self) -> u32 {
        self.version
    }
    fn item_type(&self) -> &str {
        self.codec.item_type()
    }
}

/// The default codec: serde types in [postcard](https://docs.rs/postcard)'s
/// compact binary format (varints, no field names; adding a field to an
/// item type breaks reading older records, so add fields with care or
/// bring your own [`Codec`]). Decoding takes the whole record: bytes left
/// over after the value are an error, never ignored, so a record of
/// another type that happens to start like one of this type is not misread
/// (issue 25: `(u32, u32)` records read back as `u32`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Postcard;

fn encode<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), BoxError> {
    postcard::serialize_with_flavor(value, AppendTo(out))?;
    Ok(())
}

/// Decodes a whole record: trailing bytes are an error.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BoxError> {
    let (value, rest) = postcard::take_from_bytes(bytes)?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes left over after the value: the record is of another type",
            rest.len()
        )
        .into());
    }
    Ok(value)
}

/// A postcard output that appends to a `Vec` in place: a byte is one
/// `push` (postcard's own `to_extend` goes through `Extend` per byte, and
/// shows in the cost of a stage).
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

impl<K, I> Codec<K, I> for Postcard
where
    K: Serialize + DeserializeOwned + 'static,
    I: Serialize + DeserializeOwned,
{
    #[inline]
    fn encode_tenant(&self, tenant: &K, out: &mut Vec<u8>) -> Result<(), BoxError> {
        // A `TenantId`'s bytes at once: the same 16 bytes postcard writes
        // for it (a fixed array, no length), where serde's path pushes
        // them one at a time, about a sixth of a journaled stage. The type
        // test is decided at compile time.
        if let Some(id) = (tenant as &dyn std::any::Any).downcast_ref::<crate::TenantId>() {
            out.extend_from_slice(id.0.as_bytes());
            return Ok(());
        }
        encode(tenant, out)
    }
    fn decode_tenant(&self, bytes: &[u8]) -> Result<K, BoxError> {
        decode(bytes)
    }
    fn encode_item(&self, item: &I, out: &mut Vec<u8>) -> Result<(), BoxError> {
        encode(item, out)
    }
    fn decode_item(&self, bytes: &[u8]) -> Result<I, BoxError> {
        decode(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Usage {
        id: u64,
        units: u32,
        note: String,
    }

    #[test]
    fn postcard_round_trips_after_what_is_already_in_the_buffer() {
        let c = Postcard;
        let mut out = b"prefix".to_vec();
        let u = Usage {
            id: 7,
            units: 3,
            note: "é".into(),
        };
        Codec::<u64, Usage>::encode_item(&c, &u, &mut out).unwrap();
        assert_eq!(&out[..6], b"prefix");
        let back: Usage = Codec::<u64, Usage>::decode_item(&c, &out[6..]).unwrap();
        assert_eq!(back, u);
        let mut t = Vec::new();
        Codec::<u64, Usage>::encode_tenant(&c, &42, &mut t).unwrap();
        assert_eq!(Codec::<u64, Usage>::decode_tenant(&c, &t).unwrap(), 42);
    }

    #[test]
    fn a_tenant_is_its_16_bytes() {
        let t = crate::TenantId::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let mut out = Vec::new();
        Codec::<crate::TenantId, u8>::encode_tenant(&Postcard, &t, &mut out).unwrap();
        assert_eq!(out, (1..=16).collect::<Vec<u8>>());
        let back = Codec::<crate::TenantId, u8>::decode_tenant(&Postcard, &out).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn a_tenants_bytes_copied_at_once_are_serdes_bytes() {
        // The copy in `encode_tenant` must write what postcard's serde
        // path writes, or journals written before it are misread.
        for n in [
            0u128,
            1,
            0xff,
            1 << 64,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let t = crate::TenantId::from_u128(n);
            let (mut copied, mut serde) = (b"pre".to_vec(), b"pre".to_vec());
            Codec::<crate::TenantId, u8>::encode_tenant(&Postcard, &t, &mut copied).unwrap();
            encode(&t, &mut serde).unwrap();
            assert_eq!(copied, serde, "{n:#x}");
        }
    }

    #[test]
    fn an_envelope_round_trips() {
        let e = crate::sinks::Envelope::with_id(uuid::Uuid::from_u128(7), b"{}".to_vec());
        let mut out = Vec::new();
        Codec::<u8, crate::sinks::Envelope>::encode_item(&Postcard, &e, &mut out).unwrap();
        assert_eq!(out.len(), 16 + 1 + 2);
        let back = Codec::<u8, crate::sinks::Envelope>::decode_item(&Postcard, &out).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn a_record_of_a_wider_type_is_refused_not_misread() {
        // Issue 25: items journaled as (u32, u32) and recovered by an
        // outbox of u32 were read as their first field.
        let mut out = Vec::new();
        Codec::<u8, (u32, u32)>::encode_item(&Postcard, &(7, 9), &mut out).unwrap();
        let narrow = Codec::<u8, u32>::decode_item(&Postcard, &out);
        assert!(narrow.is_err(), "{narrow:?}");
        assert_eq!(
            Codec::<u8, (u32, u32)>::decode_item(&Postcard, &out).unwrap(),
            (7, 9)
        );
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        let c = Postcard;
        assert!(Codec::<u64, Usage>::decode_item(&c, &[0xff; 3]).is_err());
        assert!(Codec::<u64, Usage>::decode_tenant(&c, &[]).is_err());
    }
}
