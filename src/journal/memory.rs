//! An in-memory [`Storage`] for tests: faults on demand, and a crash that
//! forgets what was not synced.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use super::storage::Storage;

#[derive(Debug, Default)]
struct File {
    bytes: Vec<u8>,
    /// How much of `bytes` a crash keeps.
    synced: usize,
}

#[derive(Debug, Default)]
struct Disk {
    files: BTreeMap<String, File>,
    locked: bool,
    /// Every create, append, sync, truncate and delete fails with this.
    fault: Option<io::ErrorKind>,
}

/// A [`Storage`] in memory, shared by its clones (one disk): for tests of
/// what the journal does on faults and crashes without touching a disk.
///
/// [`crash`](Self::crash) keeps of each file only what was synced, as a
/// power cut or `kill -9` followed by a lost page cache would;
/// [`fail`](Self::fail) makes every mutating call fail (a full disk, EIO,
/// a lost permission) until cleared. Creates and deletes are durable at
/// once (the real storage syncs the directory).
#[derive(Debug, Default)]
pub struct MemStorage {
    disk: Arc<Mutex<Disk>>,
    holds_lock: bool,
}

impl Clone for MemStorage {
    /// Another handle on the same disk, not holding its lock.
    fn clone(&self) -> Self {
        MemStorage {
            disk: Arc::clone(&self.disk),
            holds_lock: false,
        }
    }
}

impl Drop for MemStorage {
    fn drop(&mut self) {
        if self.holds_lock {
            self.disk().locked = false;
        }
    }
}

impl MemStorage {
    /// An empty disk.
    pub fn new() -> Self {
        MemStorage::default()
    }

    fn disk(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every file and its bytes (synced or not).
    pub fn files(&self) -> BTreeMap<String, Vec<u8>> {
        self.disk()
            .files
            .iter()
            .map(|(k, f)| (k.clone(), f.bytes.clone()))
            .collect()
    }

    /// Puts `bytes` in file `name` as if synced (a test's damage).
    pub fn put(&self, name: &str, bytes: Vec<u8>) {
        let synced = bytes.len();
        self.disk()
            .files
            .insert(name.to_owned(), File { bytes, synced });
    }

    /// Removes file `name`.
    pub fn remove(&self, name: &str) {
        self.disk().files.remove(name);
    }

    /// From now on every create, append, sync, truncate and delete fails
    /// with `kind` (`None`: no more faults).
    pub fn fail(&self, kind: Option<io::ErrorKind>) {
        self.disk().fault = kind;
    }

    /// A crash: every file keeps only its synced bytes, and the lock is
    /// free (the process that held it is gone).
    pub fn crash(&self) {
        let mut disk = self.disk();
        for f in disk.files.values_mut() {
            f.bytes.truncate(f.synced);
        }
        disk.locked = false;
    }

    fn mutate<T>(&self, name: &str, f: impl FnOnce(&mut Disk) -> io::Result<T>) -> io::Result<T> {
        let mut disk = self.disk();
        if let Some(kind) = disk.fault {
            return Err(io::Error::new(kind, format!("injected fault on {name}")));
        }
        f(&mut disk)
    }
}

fn missing(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such file"))
}

impl Storage for MemStorage {
    fn lock(&mut self) -> io::Result<()> {
        let mut disk = self.disk();
        if disk.locked && !self.holds_lock {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "journal is locked by another process",
            ));
        }
        disk.locked = true;
        drop(disk);
        self.holds_lock = true;
        Ok(())
    }

    fn list(&mut self) -> io::Result<Vec<String>> {
        Ok(self.disk().files.keys().cloned().collect())
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        self.disk()
            .files
            .get(name)
            .map(|f| f.bytes.clone())
            .ok_or_else(|| missing(name))
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        self.mutate(name, |d| {
            if d.files.contains_key(name) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    name.to_owned(),
                ));
            }
            d.files.insert(name.to_owned(), File::default());
            Ok(())
        })
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.mutate(name, |d| {
            let f = d.files.get_mut(name).ok_or_else(|| missing(name))?;
            f.bytes.extend_from_slice(bytes);
            Ok(())
        })
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.mutate(name, |d| {
            let f = d.files.get_mut(name).ok_or_else(|| missing(name))?;
            f.synced = f.bytes.len();
            Ok(())
        })
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.mutate(name, |d| {
            let f = d.files.get_mut(name).ok_or_else(|| missing(name))?;
            let len = usize::try_from(len)
                .unwrap_or(usize::MAX)
                .min(f.bytes.len());
            f.bytes.truncate(len);
            f.synced = len;
            Ok(())
        })
    }

    fn delete(&mut self, name: &str) -> io::Result<()> {
        self.mutate(name, |d| {
            d.files.remove(name).map(drop).ok_or_else(|| missing(name))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_keeps_only_synced_bytes_and_frees_the_lock() {
        let mut s = MemStorage::new();
        s.lock().unwrap();
        let mut other = s.clone();
        assert_eq!(other.lock().unwrap_err().kind(), io::ErrorKind::WouldBlock);
        s.create("a").unwrap();
        s.append("a", b"kept").unwrap();
        s.sync("a").unwrap();
        s.append("a", b" gone").unwrap();
        s.crash();
        assert_eq!(s.read("a").unwrap(), b"kept");
        other.lock().unwrap();
    }

    #[test]
    fn faults_fail_every_mutation_until_cleared() {
        let mut s = MemStorage::new();
        s.create("a").unwrap();
        s.fail(Some(io::ErrorKind::StorageFull));
        assert_eq!(
            s.append("a", b"x").unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        assert!(s.sync("a").is_err() && s.create("b").is_err() && s.delete("a").is_err());
        assert_eq!(s.read("a").unwrap(), b"", "reads still work");
        s.fail(None);
        s.append("a", b"x").unwrap();
    }
}
