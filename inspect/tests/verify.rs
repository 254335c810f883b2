//! The inspector on journals the tests write and damage (issue 25,
//! S-J13): `verify` exits 0 when clean, 1 on damage, 2 when the directory
//! is locked without `--live` or cannot be read; `show --json` gives the
//! pending items per tenant and the damaged ranges.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use outbox::journal::{inspect, JournalConfig, RawBytes};
use outbox::{Outbox, Sink, TenantId, WriteError, Written};

/// A sink that never answers: every staged item stays pending.
struct Never;

impl Sink for Never {
    type Tenant = TenantId;
    type Item = u64;
    fn name(&self) -> &str {
        "never"
    }
    async fn write(&self, _: &TenantId, _: &[u64]) -> Result<Written, WriteError> {
        std::future::pending().await
    }
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("outbox-inspect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn tool(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-inspect"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Bytes a segment of `u64` items starts with.
const HEAD: usize = 48;

/// Writes 30 items for 3 tenants, synced, in small segments; `keep_open`
/// leaves the outbox running (its lock held) for the caller.
async fn write_journal(dir: &Path) -> Outbox<Never> {
    let o = Outbox::builder(Never)
        .journal(JournalConfig::new(dir).segment_bytes(256))
        .build()
        .unwrap();
    for i in 0..30u64 {
        let staged = o.stage(TenantId::from_u128(u128::from(i % 3) + 1), i);
        assert_eq!(staged, outbox::Staged::Accepted);
    }
    assert_eq!(o.sync().await, Ok(()));
    o
}

async fn close(o: Outbox<Never>) {
    let closed = o.closed();
    o.abandon();
    drop(o);
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("closes");
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_says_clean_damaged_or_locked() {
    let d = dir("verify");
    let path = d.to_str().unwrap();
    let o = write_journal(&d).await;
    // Held by the running outbox: 2 without --live, a snapshot with it.
    assert_eq!(tool(&["verify", path]).0, 2);
    let (code, out) = tool(&["verify", path, "--live", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["live"], true);
    // Abandoned: every item is marked done (handed back), none pending.
    close(o).await;
    let (code, out) = tool(&["verify", path, "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["live"].clone(), v["clean"].clone()),
        (false.into(), true.into())
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn show_lists_pending_items_per_tenant_and_damage_with_offsets() {
    let d = dir("show");
    let path = d.to_str().unwrap();
    // A crash: the runtime's tasks stop where they are, items pending.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let d2 = d.clone();
    std::thread::spawn(move || {
        rt.block_on(async {
            let o = write_journal(&d2).await;
            std::mem::forget(o);
        });
        drop(rt);
    })
    .join()
    .unwrap();
    let r = inspect(&d, &RawBytes).unwrap();
    assert_eq!(r.pending.len(), 30);
    assert_eq!(r.per_tenant().len(), 3);
    assert!(r.is_clean());
    let (code, out) = tool(&["show", path, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pending"].as_array().unwrap().len(), 30);
    // The item bytes as hex: postcard's varint of item 0.
    assert_eq!(v["pending"][0]["item"], "00");
    // Damage the first segment with records: one byte in its first record.
    let first = r.segments.iter().find(|s| s.items > 0).unwrap();
    let file = d.join(&first.name);
    let mut bytes = std::fs::read(&file).unwrap();
    // A segment starts with its header (32 bytes) and its schema record
    // (13 bytes and the name `u64`, S-J14): 48 bytes.
    bytes[HEAD + 8] ^= 0x55;
    std::fs::write(&file, bytes).unwrap();
    let (code, out) = tool(&["verify", path, "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["clean"], false);
    assert_eq!(v["unreadable"], 1);
    let seg = v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == first.name.as_str())
        .unwrap();
    assert_eq!(seg["damaged"][0]["from"], HEAD, "{seg}");
    assert_eq!(
        (seg["codec_version"].clone(), seg["item_type"].clone()),
        (0.into(), "u64".into()),
        "{seg}"
    );
    assert_eq!(v["pending"][0]["version"], 0);
    // Not a journal: unreadable.
    std::fs::write(d.join("notes.txt"), b"hello").unwrap();
    assert_eq!(tool(&["verify", path]).0, 2);
    assert_eq!(tool(&["verify", "/nonexistent/outbox"]).0, 2);
    std::fs::remove_dir_all(&d).unwrap();
}
