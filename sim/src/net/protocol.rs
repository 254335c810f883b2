//! The wire protocol between the application's sink and the datastore: one
//! request, one reply, each a length-prefixed frame over TCP.
//!
//! Request body: `tenant: u128`, `count: u32`, then per item `id: u64`,
//! `tenant: u32`, `size: u32` and `size` payload bytes (a pattern derived
//! from the id, so the datastore can check every byte arrived intact).
//! Reply body: one tag byte, then `discarded: u32` for a commit.
//! Integers are big-endian; a frame is `len: u32` then `len` bytes.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Frames larger than this are refused (a corrupt length).
pub const MAX_FRAME: usize = 64 << 20;

/// One item as the wire carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WireItem {
    /// The item's global id (staging order across the run).
    pub id: u64,
    /// The tenant index the item was staged for.
    pub tenant: u32,
    /// Payload bytes.
    pub size: u32,
}

/// The payload byte at `i` of item `id`.
pub fn payload_byte(id: u64, i: u32) -> u8 {
    (id.wrapping_mul(31).wrapping_add(u64::from(i))) as u8
}

/// A write request: one tenant's slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The tenant (`TenantId` as a `u128`).
    pub tenant: u128,
    /// The slice, in order.
    pub items: Vec<WireItem>,
}

/// The datastore's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// The slice is committed (now or by an earlier attempt); `discarded`
    /// of its last items were consumed without being written (S-W12).
    Committed {
        /// Items consumed without writing.
        discarded: u32,
    },
    /// A retryable failure; nothing was committed.
    Busy,
    /// The slice is refused for good (terminal); nothing was committed.
    Rejected,
    /// The request did not check out (bad payload); nothing was committed.
    Corrupt,
}

impl Request {
    /// The frame (length prefix included).
    pub fn encode(&self) -> Vec<u8> {
        let payload: usize = self.items.iter().map(|i| i.size as usize).sum();
        let mut b = Vec::with_capacity(4 + 16 + 4 + self.items.len() * 16 + payload);
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&self.tenant.to_be_bytes());
        b.extend_from_slice(&(self.items.len() as u32).to_be_bytes());
        for item in &self.items {
            b.extend_from_slice(&item.id.to_be_bytes());
            b.extend_from_slice(&item.tenant.to_be_bytes());
            b.extend_from_slice(&item.size.to_be_bytes());
            b.extend((0..item.size).map(|i| payload_byte(item.id, i)));
        }
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        b
    }

    /// Parses a request body; `Ok(None)` if a payload byte is wrong.
    ///
    /// # Errors
    /// `InvalidData` if the body is truncated or has trailing bytes.
    pub fn decode(body: &[u8]) -> io::Result<Option<Request>> {
        let mut r = Reader(body);
        let tenant = u128::from_be_bytes(r.take()?);
        let count = u32::from_be_bytes(r.take()?);
        let mut items = Vec::with_capacity((count as usize).min(body.len() / 16));
        let mut intact = true;
        for _ in 0..count {
            let id = u64::from_be_bytes(r.take()?);
            let tenant = u32::from_be_bytes(r.take()?);
            let size = u32::from_be_bytes(r.take()?);
            let payload = r.bytes(size as usize)?;
            intact &= payload
                .iter()
                .zip(0..)
                .all(|(b, i)| *b == payload_byte(id, i));
            items.push(WireItem { id, tenant, size });
        }
        if !r.0.is_empty() {
            return Err(invalid("trailing bytes after the request"));
        }
        Ok(intact.then_some(Request { tenant, items }))
    }
}

impl Reply {
    /// The frame (length prefix included).
    pub fn encode(self) -> Vec<u8> {
        let mut b = vec![0, 0, 0, 0];
        match self {
            Reply::Committed { discarded } => {
                b.push(0);
                b.extend_from_slice(&discarded.to_be_bytes());
            }
            Reply::Busy => b.push(1),
            Reply::Rejected => b.push(2),
            Reply::Corrupt => b.push(3),
        }
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        b
    }

    /// Parses a reply body.
    ///
    /// # Errors
    /// `InvalidData` for an unknown tag or a wrong length.
    pub fn decode(body: &[u8]) -> io::Result<Reply> {
        let mut r = Reader(body);
        let [tag] = r.take()?;
        let reply = match tag {
            0 => Reply::Committed {
                discarded: u32::from_be_bytes(r.take()?),
            },
            1 => Reply::Busy,
            2 => Reply::Rejected,
            3 => Reply::Corrupt,
            t => return Err(invalid(&format!("unknown reply tag {t}"))),
        };
        if !r.0.is_empty() {
            return Err(invalid("trailing bytes after the reply"));
        }
        Ok(reply)
    }
}

/// Reads one frame's body; `Ok(None)` at a clean end of stream.
///
/// # Errors
/// IO errors; `InvalidData` for an oversized length.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(invalid("frame too large"));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// Writes one encoded frame.
///
/// # Errors
/// IO errors.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame).await?;
    w.flush().await
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let b = self.bytes(N)?;
        Ok(b.try_into().expect("N bytes"))
    }

    fn bytes(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(invalid("truncated frame"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let req = Request {
            tenant: 42,
            items: vec![
                WireItem {
                    id: 7,
                    tenant: 3,
                    size: 5,
                },
                WireItem {
                    id: 9,
                    tenant: 3,
                    size: 0,
                },
            ],
        };
        let frame = req.encode();
        assert_eq!(Request::decode(&frame[4..]).unwrap(), Some(req));
        let mut bad = frame.clone();
        let last = 4 + 16 + 4 + 16 + 2;
        bad[last] ^= 1;
        assert_eq!(Request::decode(&bad[4..]).unwrap(), None);
        assert!(Request::decode(&frame[4..frame.len() - 1]).is_err());
        for reply in [
            Reply::Committed { discarded: 2 },
            Reply::Busy,
            Reply::Rejected,
            Reply::Corrupt,
        ] {
            assert_eq!(Reply::decode(&reply.encode()[4..]).unwrap(), reply);
        }
    }
}
