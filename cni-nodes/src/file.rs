//! A file of Kubernetes objects read at start, then polled and published again when it
//! changes: the nodes file (`--nodes-file`, [`watch_file`]) here, and any other such file
//! through [`Poller`] (cni-policy's policy file).
//!
//! The poll looks at the file's device, inode, length, mtime and ctime every 50 ms
//! (following symlinks, so a ConfigMap volume's `..data` swap is a change). That sees a
//! file written in place and one replaced by rename alike, on any filesystem, for the cost
//! of one `stat` a tick. An inotify watch of the file's folder wakes the poll at once
//! when anything in the folder changes, so a change is not left waiting for the next
//! tick; where inotify sees nothing (NFS, a replaced parent folder, the per-user watch
//! budget spent), the ticks still do. See docs/decisions.md.
//!
//! Timestamps are as coarse as the kernel's tick, so two writes of the same length within
//! one tick look alike: while the mtime read is under a second old, every poll reads the
//! file again (and parses it only when its bytes differ from the last read's). A read during which the file changed is thrown away and done again at the
//! next poll. Writers should still replace the file by rename: a half-written YAML file can
//! parse, and is then published until the next poll reads the whole.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, StreamExt};
use inotify::{EventMask, EventStream, Inotify, WatchMask};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::node::NodeSet;
use crate::parse::{MAX_DOCUMENT_BYTES, ParseError, parse_reporting};
use crate::report::Reporter;

/// How often the file is looked at when its folder's inotify watch says nothing: a
/// change inotify does not see is published within this and a read.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// What the folder's watch wakes the poll for: anything that can make the path read
/// differently (written, replaced, a symlink swapped), and the folder itself going.
const FOLDER_EVENTS: WatchMask = WatchMask::CLOSE_WRITE
    .union(WatchMask::MODIFY)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF);

/// How long after its mtime a file is still read at every poll.
const RACY_WINDOW: Duration = Duration::from_secs(1);

/// Reads at start that may find the file changing before it is refused.
const START_TRIES: usize = 5;

/// What a polled file is called in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileKind {
    /// The file, before its path: `nodes file`.
    pub name: &'static str,
    /// What it holds, as what stays when it goes bad: `the nodes`.
    pub contents: &'static str,
}

/// The nodes file.
const NODES_FILE: FileKind = FileKind {
    name: "nodes file",
    contents: "the nodes",
};

/// A failed read of a polled file, naming it (`nodes file PATH: ...`).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{file} {}: {source}", path.display())]
    Read {
        file: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{file} {}: {source}", path.display())]
    Parse {
        file: &'static str,
        path: PathBuf,
        source: ParseError,
    },
    #[error("{file} {} kept changing while it was read", path.display())]
    Unstable { file: &'static str, path: PathBuf },
    #[error("{file} {}: the reading thread failed: {reason}", path.display())]
    Thread {
        file: &'static str,
        path: PathBuf,
        reason: String,
    },
}

/// Reads the nodes file once. Blocking.
pub fn read_nodes_file(path: &Path) -> Result<NodeSet, FileError> {
    nodes_poller(path.to_owned()).first_read()
}

/// Reads the nodes file and returns a receiver that holds its nodes, updated by a task
/// that polls the file until every receiver is dropped. A file that is missing or does not
/// parse at start is an error; later, it keeps the last good set and logs a warning.
pub async fn watch_file(path: impl Into<PathBuf>) -> Result<watch::Receiver<NodeSet>, FileError> {
    nodes_poller(path.into()).watch().await
}

/// A poller of the nodes file, whose skipped nodes are each logged once.
fn nodes_poller(path: PathBuf) -> Poller<NodeSet> {
    let mut reporter = Reporter::default();
    Poller::new(
        NODES_FILE,
        path,
        move |bytes| parse_reporting(bytes, &mut reporter),
        |set| format!("{} nodes", set.len()),
    )
}

/// How a polled file's bytes become its value; it may keep what it logged last time.
type Parse<T> = Box<dyn FnMut(&[u8]) -> Result<T, ParseError> + Send>;

/// A file of objects and how it reads: polled by [`Poller::watch`], on a blocking thread
/// for each poll.
pub struct Poller<T> {
    kind: FileKind,
    path: PathBuf,
    parse: Parse<T>,
    /// What a new value holds, for the log line that announces it: `3 nodes`.
    summary: fn(&T) -> String,
    /// The version last read, good or not.
    seen: Option<Stamp>,
    /// Whether that version must be read again to be sure of it.
    racy: bool,
    /// The bytes last read, good or not: read again unchanged, they are not parsed again.
    last: Option<Vec<u8>>,
    /// The failure last logged, so a lasting one is logged once.
    failing: Option<String>,
    /// How often the file is looked at without a wake from inotify.
    interval: Duration,
}

impl<T: PartialEq + Send + Sync + 'static> Poller<T> {
    /// A poller of the file at `path`, whose bytes `parse` reads.
    pub fn new(
        kind: FileKind,
        path: PathBuf,
        parse: impl FnMut(&[u8]) -> Result<T, ParseError> + Send + 'static,
        summary: fn(&T) -> String,
    ) -> Self {
        Self {
            kind,
            path,
            parse: Box::new(parse),
            summary,
            seen: None,
            racy: false,
            last: None,
            failing: None,
            interval: POLL_INTERVAL,
        }
    }

    /// Polls every `interval` instead of [`POLL_INTERVAL`] when inotify says nothing.
    #[cfg(test)]
    fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Reads the file and returns a receiver that holds its value, updated by a task that
    /// polls the file until every receiver is dropped. A file that is missing or does not
    /// parse at start is an error; later, it keeps the last good value and logs a
    /// warning, once while the failure lasts.
    pub async fn watch(mut self) -> Result<watch::Receiver<T>, FileError> {
        let (file, path) = (self.kind.name, self.path.clone());
        // Watched before the first read, so that no change after it goes unseen.
        let folder = FolderWatch::new(&path, self.kind);
        let (poller, first) = tokio::task::spawn_blocking(move || {
            let first = self.first_read();
            (self, first)
        })
        .await
        .map_err(|err| FileError::Thread {
            file,
            path,
            reason: err.to_string(),
        })?;
        let (tx, rx) = watch::channel(first?);
        tokio::spawn(poller.run(tx, folder));
        Ok(rx)
    }

    async fn run(mut self, tx: watch::Sender<T>, mut folder: FolderWatch) {
        let kind = self.kind;
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                () = tx.closed() => return,
                _ = ticks.tick() => folder.retry(),
                () = folder.changed() => {}
            }
            let started = Instant::now();
            let polled = tokio::task::spawn_blocking(move || {
                let value = self.poll();
                (self, value)
            })
            .await;
            let value;
            (self, value) = match polled {
                Ok(polled) => polled,
                Err(err) => {
                    tracing::error!(
                        "the {}'s poller failed, {} stay as they are: {err}",
                        kind.name,
                        kind.contents
                    );
                    return;
                }
            };
            let Some(value) = value else { continue };
            let changed = tx.send_if_modified(|current| {
                let changed = *current != value;
                *current = value;
                changed
            });
            if changed {
                tracing::info!(
                    read_ms = started.elapsed().as_millis(),
                    "{} {}: {}",
                    kind.name,
                    self.path.display(),
                    (self.summary)(&tx.borrow())
                );
            }
        }
    }
}

/// An inotify watch of the polled file's folder, which wakes the poll when something in
/// it changes. Without one (inotify refused it), the poll's ticks alone see changes.
struct FolderWatch {
    folder: PathBuf,
    kind: FileKind,
    events: Option<EventStream<[u8; 4096]>>,
    /// When the watch was last set up, or tried.
    started: Instant,
}

/// How long a folder without a watch waits before one is tried again.
const WATCH_RETRY: Duration = Duration::from_secs(10);

impl FolderWatch {
    fn new(path: &Path, kind: FileKind) -> Self {
        let folder = match path.parent() {
            Some(folder) if !folder.as_os_str().is_empty() => folder.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut watch = Self {
            folder,
            kind,
            events: None,
            started: Instant::now(),
        };
        watch.start();
        watch
    }

    /// Watches the folder now at the path (again, after it went).
    fn start(&mut self) {
        self.started = Instant::now();
        let started = Inotify::init().and_then(|inotify| {
            inotify.watches().add(&self.folder, FOLDER_EVENTS)?;
            inotify.into_event_stream([0u8; 4096])
        });
        self.events = match started {
            Ok(events) => Some(events),
            Err(err) => {
                tracing::debug!(
                    "{} folder {}: no inotify watch ({err}); polled every {:?}",
                    self.kind.name,
                    self.folder.display(),
                    POLL_INTERVAL
                );
                None
            }
        };
    }

    /// Tries again to watch a folder that has no watch, now and then.
    fn retry(&mut self) {
        if self.events.is_none() && self.started.elapsed() >= WATCH_RETRY {
            self.start();
        }
    }

    /// Returns when something in the folder changed (never, without a watch), once the
    /// events that came with it are read: a burst of writes wakes the poll once.
    async fn changed(&mut self) {
        let Some(events) = self.events.as_mut() else {
            return std::future::pending().await;
        };
        let mut gone = false;
        let mut next = events.next().await;
        loop {
            match next {
                // Any event is a change, a full queue's too.
                Some(Ok(event)) => {
                    gone |= event.mask.intersects(
                        EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED,
                    );
                }
                // A watch that fails is dropped; the ticks try a new one later
                // (`retry`), so a failing one cannot wake the poll in a loop.
                Some(Err(_)) | None => {
                    self.events = None;
                    return;
                }
            }
            match events.next().now_or_never() {
                Some(more) => next = more,
                None => break,
            }
        }
        if gone {
            self.start();
        }
    }
}

/// What identifies a version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether a write within the same timestamp tick could still go unseen.
    fn racy(&self, now: SystemTime) -> bool {
        let (secs, nanos) = self.mtime;
        let Ok(secs) = u64::try_from(secs) else {
            return false;
        };
        let nanos = u32::try_from(nanos).unwrap_or(0);
        let mtime = UNIX_EPOCH + Duration::new(secs, nanos);
        match now.duration_since(mtime) {
            Ok(age) => age < RACY_WINDOW,
            // An mtime in the future: the clock moved back, or the file was touched so.
            Err(_) => true,
        }
    }
}

impl<T> Poller<T> {
    /// Reads the file at start: an error when it is missing, does not parse, or keeps
    /// changing while it is read. Blocking.
    fn first_read(&mut self) -> Result<T, FileError> {
        let file = self.kind.name;
        for _ in 0..START_TRIES {
            let Some(bytes) = self.read().map_err(|source| FileError::Read {
                file,
                path: self.path.clone(),
                source,
            })?
            else {
                std::thread::sleep(POLL_INTERVAL / 5);
                continue;
            };
            let parsed = (self.parse)(&bytes);
            self.last = Some(bytes);
            return parsed.map_err(|source| FileError::Parse {
                file,
                path: self.path.clone(),
                source,
            });
        }
        Err(FileError::Unstable {
            file,
            path: self.path.clone(),
        })
    }

    /// Looks at the file; its value when a version not read yet parsed. Blocking.
    fn poll(&mut self) -> Option<T> {
        let stamp = match std::fs::metadata(&self.path) {
            Ok(meta) => Stamp::of(&meta),
            Err(err) => {
                self.seen = None;
                self.fail(&err.to_string());
                return None;
            }
        };
        if self.seen == Some(stamp) && !self.racy {
            return None;
        }
        let bytes = match self.read() {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return None,
            Err(err) => {
                self.fail(&err.to_string());
                return None;
            }
        };
        if self.last.as_ref() == Some(&bytes) && self.failing.is_none() {
            return None;
        }
        let parsed = (self.parse)(&bytes);
        self.last = Some(bytes);
        match parsed {
            Ok(value) => {
                if self.failing.take().is_some() {
                    tracing::info!("{} {} reads again", self.kind.name, self.path.display());
                }
                Some(value)
            }
            Err(err) => {
                self.fail(&err.to_string());
                None
            }
        }
    }

    /// Reads the file whole and records its stamp; None when it changed during the read.
    fn read(&mut self) -> io::Result<Option<Vec<u8>>> {
        let now = SystemTime::now();
        let mut file = File::open(&self.path)?;
        let before = Stamp::of(&file.metadata()?);
        let limit = MAX_DOCUMENT_BYTES + 1;
        let expected = usize::try_from(before.len).unwrap_or(limit).min(limit);
        let mut bytes = Vec::with_capacity(expected);
        (&mut file).take(limit as u64).read_to_end(&mut bytes)?;
        let after = Stamp::of(&file.metadata()?);
        if before != after {
            return Ok(None);
        }
        self.seen = Some(before);
        self.racy = before.racy(now);
        Ok(Some(bytes))
    }

    fn fail(&mut self, reason: &str) {
        if self.failing.as_deref() == Some(reason) {
            return;
        }
        tracing::warn!(
            "{} {}: {reason}; {} stay as last read",
            self.kind.name,
            self.path.display(),
            self.kind.contents
        );
        self.failing = Some(reason.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp_at(secs: i64, nanos: i64) -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            len: 3,
            mtime: (secs, nanos),
            ctime: (secs, nanos),
        }
    }

    #[test]
    fn a_stamp_is_racy_for_a_second_after_its_mtime() {
        let now = UNIX_EPOCH + Duration::new(1_000, 500_000_000);
        assert!(stamp_at(1_000, 0).racy(now));
        assert!(stamp_at(999, 600_000_000).racy(now));
        assert!(!stamp_at(999, 500_000_000).racy(now));
        assert!(!stamp_at(10, 0).racy(now));
        assert!(stamp_at(2_000, 0).racy(now), "an mtime in the future");
    }

    /// A poller of `path` that counts its parses, taking the file's text as its value.
    fn counting(
        path: PathBuf,
    ) -> (
        Poller<String>,
        std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        };
        let parses = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&parses);
        let kind = FileKind {
            name: "test file",
            contents: "its text",
        };
        let poller = Poller::new(
            kind,
            path,
            move |bytes: &[u8]| {
                counted.fetch_add(1, Ordering::Relaxed);
                Ok(String::from_utf8_lossy(bytes).into_owned())
            },
            |text: &String| format!("{} bytes", text.len()),
        );
        (poller, parses)
    }

    #[test]
    fn a_file_read_again_unchanged_is_not_parsed_again_and_a_change_is() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join("objects.yaml");
        std::fs::write(&path, "one").expect("written");
        let (mut poller, parses) = counting(path.clone());
        assert_eq!(poller.first_read().expect("read"), "one");
        // Just written: racy, so every poll reads it again, and finds the same bytes.
        assert_eq!(poller.poll(), None);
        assert_eq!(poller.poll(), None);
        assert_eq!(parses.load(Ordering::Relaxed), 1, "parsed once");
        // Rewritten within the same tick, same length: read again, parsed, published.
        std::fs::write(&path, "two").expect("written");
        assert_eq!(poller.poll().as_deref(), Some("two"));
        assert_eq!(parses.load(Ordering::Relaxed), 2);
    }

    /// The folder's inotify watch publishes a file replaced by rename, one written in
    /// place, and a folder of them swapped in by rename (a ConfigMap volume's `..data`)
    /// long before the next tick of a slow poll.
    #[tokio::test]
    async fn a_change_is_published_at_once_not_at_the_next_tick() {
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join("objects.yaml");
        std::fs::write(&path, "one").expect("written");
        let (poller, _) = counting(path.clone());
        let rx = poller
            .every(Duration::from_secs(3600))
            .watch()
            .await
            .expect("read");
        assert_eq!(*rx.borrow(), "one");
        let published = |expected: &'static str| {
            let mut rx = rx.clone();
            async move {
                let seen = tokio::time::timeout(
                    Duration::from_secs(5),
                    rx.wait_for(|text| text == expected),
                )
                .await;
                assert!(seen.is_ok(), "{expected:?} not published within 5 s");
            }
        };
        // Replaced by rename.
        std::fs::write(dir.path().join("next"), "two").expect("written");
        std::fs::rename(dir.path().join("next"), &path).expect("renamed");
        published("two").await;
        // Written in place.
        std::fs::write(&path, "three!").expect("written");
        published("three!").await;
        // A ConfigMap volume: the path a symlink into `..data`, itself a symlink to the
        // folder of the current version, swapped by rename.
        for (version, text) in [(1, "four"), (2, "five")] {
            let data = dir.path().join(format!("..data_{version}"));
            std::fs::create_dir(&data).expect("a folder");
            std::fs::write(data.join("objects.yaml"), text).expect("written");
            std::os::unix::fs::symlink(&data, dir.path().join("..data_tmp")).expect("linked");
            std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data"))
                .expect("swapped");
            if version == 1 {
                std::fs::remove_file(&path).expect("removed");
                std::os::unix::fs::symlink("..data/objects.yaml", &path).expect("linked");
            }
            published(text).await;
        }
    }
}
