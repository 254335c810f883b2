//! A `MemStorage` whose mutating calls first pass a gate the test sets:
//! the fault-injecting disk the journal's fault tests share, and the
//! journal config and build they use.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use outbox::journal::{JournalConfig, MemStorage, Storage};
use outbox::Outbox;

use super::TestSink;

/// Asked before each mutating call, with (op, file, bytes for `append`,
/// the disk): `Err` fails the call, which then changes nothing.
pub type Gate = Arc<dyn Fn(&'static str, &str, &[u8], &MemStorage) -> io::Result<()> + Send + Sync>;

/// A `MemStorage` behind a [`Gate`]; `lock`, `list` and `read` always work.
#[derive(Clone)]
pub struct Gated {
    pub mem: MemStorage,
    gate: Gate,
}

impl Gated {
    pub fn new(mem: &MemStorage, gate: Gate) -> Self {
        Gated {
            mem: mem.clone(),
            gate,
        }
    }
}

impl Storage for Gated {
    fn lock(&mut self) -> io::Result<()> {
        self.mem.lock()
    }
    fn list(&mut self) -> io::Result<Vec<String>> {
        self.mem.list()
    }
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        self.mem.read(name)
    }
    fn create(&mut self, name: &str) -> io::Result<()> {
        (self.gate)("create", name, &[], &self.mem)?;
        self.mem.create(name)
    }
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        (self.gate)("append", name, bytes, &self.mem)?;
        self.mem.append(name, bytes)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        (self.gate)("sync", name, &[], &self.mem)?;
        self.mem.sync(name)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        (self.gate)("truncate", name, &[], &self.mem)?;
        self.mem.truncate(name, len)
    }
    fn delete(&mut self, name: &str) -> io::Result<()> {
        (self.gate)("delete", name, &[], &self.mem)?;
        self.mem.delete(name)
    }
}

/// The fault tests' journal: commits every 1 ms, 4 KiB segments, retries
/// every `retry`, the commit run on the journal's task (`inline_io`).
pub fn config(storage: impl Storage, retry: Duration) -> JournalConfig {
    JournalConfig::with_storage(storage)
        .sync_interval(Duration::from_millis(1))
        .segment_bytes(4_096)
        .retry_interval(retry)
        .inline_io(true)
}

/// An outbox on `sink` with [`config`]'s journal.
pub fn build(sink: &TestSink, storage: impl Storage, retry: Duration) -> Outbox<TestSink> {
    Outbox::builder(sink.clone())
        .journal(config(storage, retry))
        .build()
        .unwrap()
}
