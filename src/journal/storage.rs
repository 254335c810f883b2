//! Where the journal's bytes live: the [`Storage`] trait and its
//! `std::fs` implementation, [`FsStorage`].
//!
//! The trait is the whole of the journal's file IO, shaped after the
//! `std::fs` calls a simulated disk also offers (turmoil's `unstable-fs`:
//! create, append, `sync_data`, `set_len`, read, `read_dir`,
//! `remove_file`, `sync_dir`), so the very same journal code runs on a
//! real disk and on a simulated one with crashes.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;

/// The file IO the journal needs, on one directory. Names are plain file
/// names in that directory (no separators).
///
/// Calls block: the journal's driver makes them off the callers' threads.
/// Every method reports failure as an [`io::Error`]; none may panic.
pub trait Storage: Send + 'static {
    /// Takes the directory for this process: a second holder must get an
    /// error of kind [`io::ErrorKind::WouldBlock`] (S-J6). Held until the
    /// storage is dropped.
    ///
    /// # Errors
    /// `WouldBlock` when another holder has it; any other IO error.
    fn lock(&mut self) -> io::Result<()>;

    /// The names of the files in the directory, sorted.
    ///
    /// # Errors
    /// The directory cannot be read.
    fn list(&mut self) -> io::Result<Vec<String>>;

    /// The whole content of file `name`.
    ///
    /// # Errors
    /// Missing or unreadable.
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>>;

    /// Creates the empty file `name` (an error if it exists), and makes its
    /// directory entry durable.
    ///
    /// # Errors
    /// It exists, or the disk refused.
    fn create(&mut self, name: &str) -> io::Result<()>;

    /// Appends `bytes` to the end of file `name` (not yet durable).
    ///
    /// # Errors
    /// Missing file, disk full, IO error; part of `bytes` may have been
    /// written.
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()>;

    /// Makes every byte appended to `name` durable (`fdatasync`).
    ///
    /// # Errors
    /// The disk did not confirm: nothing appended since the last
    /// successful sync may be relied on.
    fn sync(&mut self, name: &str) -> io::Result<()>;

    /// Cuts file `name` to `len` bytes, durably.
    ///
    /// # Errors
    /// Missing file or IO error.
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;

    /// Deletes file `name` and makes the deletion durable.
    ///
    /// # Errors
    /// Missing file or IO error.
    fn delete(&mut self, name: &str) -> io::Result<()>;
}

impl<S: Storage + ?Sized> Storage for Box<S> {
    fn lock(&mut self) -> io::Result<()> {
        (**self).lock()
    }
    fn list(&mut self) -> io::Result<Vec<String>> {
        (**self).list()
    }
    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        (**self).read(name)
    }
    fn create(&mut self, name: &str) -> io::Result<()> {
        (**self).create(name)
    }
    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        (**self).append(name, bytes)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        (**self).sync(name)
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        (**self).truncate(name, len)
    }
    fn delete(&mut self, name: &str) -> io::Result<()> {
        (**self).delete(name)
    }
}

/// The name of the lock file in a journal directory.
pub const LOCK_FILE: &str = "LOCK";

/// Files [`FsStorage`] keeps open for appending at most: the current
/// segment and a few sealed ones (S-J11). With the lock and the one a read,
/// a create or a directory sync opens for a moment, the journal holds at
/// most 7 descriptors whatever the segment count.
pub const OPEN_FILES: usize = 5;

/// A [`Storage`] on a directory of the real file system: `fdatasync`
/// through [`File::sync_data`], the directory synced after a create or a
/// delete, an advisory lock on the `LOCK` file ([`fs4`], `flock`).
///
/// It keeps at most `OPEN_FILES` (5) files open for appending, the ones used
/// last; another is opened when it is written to, synced or cut, and the
/// least recently used closed (S-J11): an outage with small segments
/// cannot run the process out of descriptors. `fdatasync` on a file opened
/// again makes durable what was written through the descriptor closed
/// before.
pub struct FsStorage {
    dir: PathBuf,
    lock: Option<File>,
    /// Files open for appending, by name, with when each was used last.
    open: BTreeMap<String, (File, u64)>,
    uses: u64,
}

impl fmt::Debug for FsStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FsStorage")
            .field("dir", &self.dir)
            .field("locked", &self.lock.is_some())
            .finish_non_exhaustive()
    }
}

impl FsStorage {
    /// A storage on `dir`, created (with its parents) if missing.
    ///
    /// # Errors
    /// The directory cannot be created, or `dir` is not a directory.
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        // A file in the way says so, not "File exists" (create_dir_all's
        // answer when a file holds the name).
        if fs::metadata(&dir).is_err() {
            fs::create_dir_all(&dir)?;
        }
        if !fs::metadata(&dir)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Ok(FsStorage {
            dir,
            lock: None,
            open: BTreeMap::new(),
            uses: 0,
        })
    }

    /// The directory.
    #[cfg(feature = "testkit")]
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn file(&mut self, name: &str) -> io::Result<&mut File> {
        self.uses += 1;
        if !self.open.contains_key(name) {
            self.make_room();
            let file = OpenOptions::new().append(true).open(self.path(name))?;
            self.open.insert(name.to_owned(), (file, self.uses));
        }
        let (file, used) = self.open.get_mut(name).expect("kept above");
        *used = self.uses;
        Ok(file)
    }

    /// Closes the least recently used files until one more may open
    /// within [`OPEN_FILES`].
    fn make_room(&mut self) {
        while self.open.len() >= OPEN_FILES {
            let oldest = self
                .open
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(n, _)| n.clone())
                .expect("not empty");
            self.open.remove(&oldest);
        }
    }
}

impl Storage for FsStorage {
    fn lock(&mut self) -> io::Result<()> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.path(LOCK_FILE))?;
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => {
                self.lock = Some(file);
                Ok(())
            }
            Err(fs4::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "journal {} is locked by another process, or by an outbox of this one \
                     still open or closing (await `Outbox::closed` before building on it again)",
                    self.dir.display()
                ),
            )),
            Err(fs4::TryLockError::Error(e)) => Err(e),
        }
    }

    fn list(&mut self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn read(&mut self, name: &str) -> io::Result<Vec<u8>> {
        fs::read(self.path(name))
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        self.make_room();
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(self.path(name))?;
        self.uses += 1;
        self.open.insert(name.to_owned(), (file, self.uses));
        self.sync_dir()
    }

    fn append(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.file(name)?.write_all(bytes)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.file(name)?.sync_data()
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        let file = self.file(name)?;
        file.set_len(len)?;
        file.sync_data()
    }

    fn delete(&mut self, name: &str) -> io::Result<()> {
        self.open.remove(name);
        fs::remove_file(self.path(name))?;
        self.sync_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("outbox-storage-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn files_are_created_appended_cut_listed_and_deleted() {
        let dir = temp("cycle");
        let mut s = FsStorage::new(&dir).unwrap();
        s.create("a").unwrap();
        assert_eq!(
            s.create("a").unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        s.append("a", b"hello ").unwrap();
        s.append("a", b"world").unwrap();
        s.sync("a").unwrap();
        assert_eq!(s.read("a").unwrap(), b"hello world");
        s.truncate("a", 5).unwrap();
        s.append("a", b"!").unwrap();
        assert_eq!(s.read("a").unwrap(), b"hello!");
        s.create("b").unwrap();
        assert_eq!(s.list().unwrap(), ["a", "b"]);
        s.delete("a").unwrap();
        assert_eq!(s.list().unwrap(), ["b"]);
        assert_eq!(s.read("a").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(s.append("a", b"x").is_err(), "appending to a deleted file");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_lock_on_one_directory_is_refused() {
        // S-J6. flock locks are per open file description, so a second
        // storage in this process stands for a second process.
        let dir = temp("lock");
        let mut first = FsStorage::new(&dir).unwrap();
        first.lock().unwrap();
        let mut second = FsStorage::new(&dir).unwrap();
        let err = second.lock().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(err.to_string().contains("locked by another process"));
        drop(first);
        second.lock().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_an_error() {
        let dir = temp("notdir");
        fs::write(&dir, b"x").unwrap();
        assert!(FsStorage::new(&dir).is_err());
        fs::remove_file(&dir).unwrap();
    }
}
