//! The `lazyfs` helper's file system: a read-only FUSE view of one eStargz layer's tree, in
//! overlay's whiteout format, whose file bytes come from the layer's cache file. A chunk not yet
//! there is asked of the daemon (one byte back: filled and verified, or not), so nothing is
//! served that has not matched its digest. Single-threaded, no tokio.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::ops::Bound;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen,
    ReplyXattr, Request,
};

use super::toc::{Kind, Node, Tree};

/// The tree never changes: the kernel may keep what it learns.
const TTL: Duration = Duration::from_secs(24 * 3600);
const OPAQUE: &str = "trusted.overlay.opaque";
/// How long a chunk may take the daemon (a large chunk over a slow registry).
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a restarting daemon is waited for.
const RECONNECT: Duration = Duration::from_secs(30);

pub struct LazyFs {
    tree: Tree,
    cache: File,
    present: Vec<bool>,
    socket: PathBuf,
    daemon: Option<UnixStream>,
    /// Where the last `readdir` stopped: its directory, the offset the kernel asks next, and
    /// the last name given. A listing read in order resumes there, not by skipping from the
    /// first child (quadratic in a directory of 500,000 children).
    cursor: Option<(u64, i64, OsString)>,
}

impl LazyFs {
    pub fn new(tree: Tree, cache: File, socket: PathBuf) -> LazyFs {
        let present = vec![false; tree.chunks.len()];
        LazyFs {
            tree,
            cache,
            present,
            socket,
            daemon: None,
            cursor: None,
        }
    }

    fn node(&self, ino: u64) -> Option<&Node> {
        self.tree.nodes.get(ino.checked_sub(1)? as usize)
    }

    fn attr(&self, ino: u64, n: &Node) -> FileAttr {
        let time = UNIX_EPOCH + Duration::from_secs(n.mtime.max(0) as u64);
        let (major, minor) = n.rdev;
        FileAttr {
            ino,
            size: n.size,
            blocks: n.size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind: file_type(n.kind),
            perm: (n.mode & 0o7777) as u16,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: ((major & 0xfff) << 8) | (minor & 0xff) | ((minor & !0xff) << 12),
            blksize: 4096,
            flags: 0,
        }
    }

    /// Asks the daemon for chunk `index`. A daemon restarting is waited for (at most
    /// `RECONNECT`), then the read fails.
    fn fetch(&mut self, index: usize) -> Result<(), i32> {
        let started = std::time::Instant::now();
        loop {
            if self.daemon.is_none() {
                match UnixStream::connect(&self.socket) {
                    Ok(s) => {
                        let _ = s.set_read_timeout(Some(FETCH_TIMEOUT));
                        self.daemon = Some(s);
                    }
                    Err(_) if started.elapsed() < RECONNECT => {
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                    Err(_) => return Err(libc::EIO),
                }
            }
            let Some(s) = self.daemon.as_mut() else {
                continue;
            };
            let mut answer = [0u8; 1];
            let asked = s
                .write_all(&(index as u32).to_le_bytes())
                .and_then(|()| s.read_exact(&mut answer));
            match asked {
                Ok(()) if answer[0] == 0 => {
                    self.present[index] = true;
                    return Ok(());
                }
                Ok(()) => return Err(libc::EIO),
                Err(_) if started.elapsed() < RECONNECT => self.daemon = None,
                Err(_) => {
                    self.daemon = None;
                    return Err(libc::EIO);
                }
            }
        }
    }

    fn read_file(&mut self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, i32> {
        let n = self.node(ino).ok_or(libc::ENOENT)?;
        if n.kind != Kind::File {
            return Err(libc::EISDIR);
        }
        let end = offset.saturating_add(u64::from(size)).min(n.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let (first, last) = n.chunks;
        let base = n.base;
        let chunks = &self.tree.chunks[first..last];
        let from = chunks.partition_point(|c| c.file_offset + c.size <= offset);
        let wanted: Vec<usize> = chunks[from..]
            .iter()
            .take_while(|c| c.file_offset < end)
            .enumerate()
            .map(|(i, _)| first + from + i)
            .filter(|i| !self.present[*i])
            .collect();
        for i in wanted {
            self.fetch(i)?;
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        self.cache
            .read_exact_at(&mut buf, base + offset)
            .map_err(|_| libc::EIO)?;
        Ok(buf)
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
        Kind::Char => FileType::CharDevice,
        Kind::Block => FileType::BlockDevice,
        Kind::Fifo => FileType::NamedPipe,
    }
}

/// A directory's entries from `offset` on, each with the offset of the one after it: `.`, `..`,
/// then its children by name. `after` is the name of the entry before `offset`, when known
/// and it is a child's (then the children are found by name, not counted through: `-a` sorts
/// before `..`, so a cursor on a dot is never used).
fn listing<'a>(
    tree: &'a Tree,
    ino: u64,
    n: &'a Node,
    offset: i64,
    after: Option<&OsStr>,
) -> Box<dyn Iterator<Item = (i64, u64, FileType, &'a OsStr)> + 'a> {
    let entry = |(name, i): (&'a OsString, &'a usize)| {
        (
            *i as u64 + 1,
            file_type(tree.nodes[*i].kind),
            name.as_os_str(),
        )
    };
    let skip = usize::try_from(offset).unwrap_or(0);
    match after {
        Some(name) if skip > 2 => Box::new(
            n.children
                .range::<OsStr, _>((Bound::Excluded(name), Bound::Unbounded))
                .map(entry)
                .zip(offset..)
                .map(|((i, k, name), at)| (at + 1, i, k, name)),
        ),
        _ => {
            let dots = [
                (ino, FileType::Directory, OsStr::new(".")),
                (ino, FileType::Directory, OsStr::new("..")),
            ];
            Box::new(
                dots.into_iter()
                    .chain(n.children.iter().map(entry))
                    .zip(0i64..)
                    .skip(skip)
                    .map(|((i, k, name), at)| (at + 1, i, k, name)),
            )
        }
    }
}

/// Replies with `value` as getxattr/listxattr want: its size when asked for 0 bytes.
fn xattr_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(libc::ERANGE);
    } else {
        reply.data(value);
    }
}

impl Filesystem for LazyFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let found = parent
            .checked_sub(1)
            .and_then(|p| self.tree.child(p as usize, name));
        match found {
            Some(i) => {
                let ino = i as u64 + 1;
                let attr = self.attr(ino, &self.tree.nodes[i]);
                reply.entry(&TTL, &attr, 0);
            }
            None => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.node(ino) {
            Some(n) => reply.attr(&TTL, &self.attr(ino, n)),
            None => reply.error(libc::ENOENT),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        match self.node(ino) {
            Some(n) if n.kind == Kind::Symlink => reply.data(n.target.as_bytes()),
            Some(_) => reply.error(libc::EINVAL),
            None => reply.error(libc::ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(libc::EROFS);
        }
        match self.node(ino) {
            Some(_) => reply.opened(0, fuser::consts::FOPEN_KEEP_CACHE),
            None => reply.error(libc::ENOENT),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        match self.read_file(ino, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let Some(n) = self.node(ino).filter(|n| n.kind == Kind::Dir) else {
            return reply.error(libc::ENOTDIR);
        };
        let after = match &self.cursor {
            Some((i, at, name)) if *i == ino && *at == offset => Some(name.as_os_str()),
            _ => None,
        };
        let mut last = None;
        for (next, child, kind, name) in listing(&self.tree, ino, n, offset, after) {
            if reply.add(child, next, kind, name) {
                break;
            }
            last = Some((next, name));
        }
        let cursor = last.map(|(next, name)| (ino, next, name.to_os_string()));
        if cursor.is_some() {
            self.cursor = cursor;
        }
        reply.ok();
    }

    fn getxattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let Some(n) = self.node(ino) else {
            return reply.error(libc::ENOENT);
        };
        if n.opaque && name == OPAQUE {
            return xattr_reply(reply, size, b"y");
        }
        match n.xattrs.iter().find(|(k, _)| k == name) {
            Some((_, v)) => xattr_reply(reply, size, v),
            None => reply.error(libc::ENODATA),
        }
    }

    fn listxattr(&mut self, _req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr) {
        let Some(n) = self.node(ino) else {
            return reply.error(libc::ENOENT);
        };
        let mut names = Vec::new();
        for (k, _) in &n.xattrs {
            names.extend_from_slice(k.as_bytes());
            names.push(0);
        }
        if n.opaque {
            names.extend_from_slice(OPAQUE.as_bytes());
            names.push(0);
        }
        xattr_reply(reply, size, &names);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_resumed_by_name_is_the_listing_counted_through() {
        let mut entries: Vec<serde_json::Value> = (0..50)
            .map(|i| serde_json::json!({"name": format!("d/f{i:02}"), "type": "reg"}))
            .collect();
        for name in ["d/-a", "d/...", "d/.-"] {
            entries.push(serde_json::json!({"name": name, "type": "reg"}));
        }
        let json =
            serde_json::to_vec(&serde_json::json!({"version": 1, "entries": entries})).unwrap();
        let tree = Tree::parse(&json, 1000, false).unwrap();
        let d = tree.child(0, OsStr::new("d")).unwrap();
        let (ino, n) = (d as u64 + 1, &tree.nodes[d]);
        let whole: Vec<_> = listing(&tree, ino, n, 0, None).collect();
        assert_eq!(whole.len(), 55);
        assert_eq!(
            (whole[0].3, whole[2].3),
            (OsStr::new("."), OsStr::new("-a"))
        );
        // In pages, each resumed from the last name given, as the kernel reads it.
        for size in 1..=8 {
            let mut paged = Vec::new();
            let (mut offset, mut after) = (0i64, None::<OsString>);
            loop {
                let page: Vec<_> = listing(&tree, ino, n, offset, after.as_deref())
                    .take(size)
                    .collect();
                let Some(last) = page.last() else { break };
                (offset, after) = (last.0, Some(last.3.to_os_string()));
                paged.extend(page);
            }
            assert_eq!(paged, whole, "pages of {size}");
        }
        // An offset asked again out of order is counted through.
        let again: Vec<_> = listing(&tree, ino, n, 30, None).collect();
        assert_eq!(again, whole[30..]);
    }
}
