//! An eStargz layer's table of contents, read as hostile: the footer that locates it, the gzip
//! member that holds it, and the tree it describes, checked whole before anything is served
//! (names, kinds, links, that each file's chunks cover it exactly and lie inside the blob). The
//! tree gives every file a place in the layer's cache file, the same for the daemon, which
//! fills it, and the `lazyfs` helper, which reads it.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStringExt;

use base64::Engine as _;
use serde::Deserialize;

use crate::content::Digest;

/// The layer annotation naming the TOC's digest; the manifest's digest covers it.
pub const TOC_DIGEST_ANNOTATION: &str = "containerd.io/snapshot/stargz/toc.digest";
/// The footer: an empty gzip member whose extra field holds the TOC's offset.
pub const FOOTER_SIZE: u64 = 51;
/// The TOC's compressed member and its JSON are each at most this.
pub const MAX_TOC: u64 = 64 << 20;
/// Entries a TOC may hold: the helper keeps the tree in memory.
pub const MAX_ENTRIES: usize = 1 << 19;
/// A chunk's bytes are verified in memory, and its compressed member is fetched whole.
pub const MAX_CHUNK: u64 = 64 << 20;
const TOC_NAME: &str = "stargz.index.json";
/// The largest device numbers the kernel's 32-bit encoding (FUSE's `rdev`) holds.
const MAX_MAJOR: u32 = 0xfff;
const MAX_MINOR: u32 = 0xf_ffff;
/// What a chunk's fetch may take past its bytes: a gzip header and deflate's overhead.
const MEMBER_SLACK: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum TocError {
    #[error("footer: {0}")]
    Footer(&'static str),
    #[error("TOC member: {0}")]
    Member(String),
    #[error("TOC JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("TOC entry {index} ({name:?}): {reason}")]
    Entry {
        index: usize,
        name: String,
        reason: Refusal,
    },
    #[error("TOC version {0} (1 is known)")]
    Version(u32),
    #[error("TOC of {0} entries (at most {MAX_ENTRIES})")]
    Entries(usize),
    #[error("TOC: a chunk at {at} is not before the TOC at {toc}")]
    PastToc { at: u64, toc: u64 },
    #[error("TOC: the files' sizes overflow")]
    Overflow,
    #[error("TOC: {0}")]
    Last(Refusal),
}

/// Why a TOC entry is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Name(&'static str),
    #[error("{0:?} is not a directory")]
    NotDir(String),
    #[error("unknown type {0:?}")]
    Kind(String),
    #[error("hard link to {0:?}, not in this layer")]
    LinkOut(String),
    #[error("hard link to a directory")]
    LinkDir,
    #[error("chunk at {at} where {due} was due")]
    ChunkOrder { at: u64, due: u64 },
    #[error("{0}")]
    Chunk(&'static str),
    #[error("chunkDigest: {0}")]
    Digest(#[source] crate::content::Error),
    #[error("xattr {name}: {source}")]
    Xattr {
        name: String,
        source: base64::DecodeError,
    },
    #[error("a file's chunks cover {covered} of its {size} bytes")]
    Uncovered { covered: u64, size: u64 },
    #[error("too many nodes")]
    TooMany,
    #[error("device {major}:{minor} is past Linux's device numbers (12-bit major, 20-bit minor)")]
    DeviceNumber { major: u32, minor: u32 },
}

/// Why a chunk's bytes are not served.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("reading its gzip member: {0}")]
    Gzip(#[from] std::io::Error),
    #[error("{got} bytes where {due} were due")]
    Short { got: u64, due: u64 },
    #[error("digest {got}, the TOC says {want}")]
    Digest { got: Digest, want: Digest },
}

/// The TOC's offset in the blob, from the blob's last `FOOTER_SIZE` bytes.
pub fn toc_offset(footer: &[u8]) -> Result<u64, TocError> {
    if footer.len() as u64 != FOOTER_SIZE {
        return Err(TocError::Footer("not 51 bytes"));
    }
    if footer[..4] != [0x1f, 0x8b, 8, 4] || footer[10..12] != [26, 0] {
        return Err(TocError::Footer(
            "not a gzip header with a 26-byte extra field",
        ));
    }
    if &footer[12..16] != b"SG\x16\x00" || &footer[32..38] != b"STARGZ" {
        return Err(TocError::Footer("no eStargz subfield"));
    }
    let hex = std::str::from_utf8(&footer[16..32]).map_err(|_| TocError::Footer("offset"))?;
    u64::from_str_radix(hex, 16).map_err(|_| TocError::Footer("offset is not hex"))
}

/// The TOC JSON from its gzip member (a tar holding `stargz.index.json`).
pub fn toc_json(member: &[u8]) -> Result<Vec<u8>, TocError> {
    let gz = flate2::read::GzDecoder::new(member).take(MAX_TOC + 4096);
    let mut archive = tar::Archive::new(gz);
    let bad = |e: std::io::Error| TocError::Member(e.to_string());
    let mut entries = archive.entries().map_err(bad)?;
    let mut entry = entries
        .next()
        .ok_or_else(|| TocError::Member("empty".into()))?
        .map_err(bad)?;
    if entry.path_bytes().as_ref() != TOC_NAME.as_bytes() {
        return Err(TocError::Member(format!("its entry is not {TOC_NAME}")));
    }
    if entry.size() > MAX_TOC {
        return Err(TocError::Member("larger than 64 MiB".into()));
    }
    let mut json = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut json).map_err(bad)?;
    Ok(json)
}

#[derive(Deserialize)]
struct RawToc {
    version: u32,
    #[serde(deserialize_with = "bounded_entries")]
    entries: Vec<RawEntry>,
}

/// The entries, refused at the first past `MAX_ENTRIES`: never a vector of any length a small
/// JSON of empty objects asks for.
fn bounded_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<RawEntry>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<RawEntry>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "at most {MAX_ENTRIES} entries")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(e) = seq.next_element()? {
                if out.len() == MAX_ENTRIES {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_ENTRIES} entries"
                    )));
                }
                out.push(e);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded)
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawEntry {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    size: u64,
    modtime: String,
    link_name: String,
    mode: u32,
    uid: u32,
    gid: u32,
    dev_major: u32,
    dev_minor: u32,
    xattrs: BTreeMap<String, String>,
    offset: u64,
    inner_offset: u64,
    chunk_offset: u64,
    chunk_size: u64,
    chunk_digest: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Char,
    Block,
    Fifo,
}

/// One inode of the layer. Node 0 is the root.
#[derive(Debug, Clone)]
pub struct Node {
    pub kind: Kind,
    /// Permission bits with set-id and sticky.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub size: u64,
    pub rdev: (u32, u32),
    pub target: OsString,
    pub xattrs: Vec<(OsString, Vec<u8>)>,
    /// `.wh..wh..opq` was in this directory.
    pub opaque: bool,
    /// A `.wh.` entry: a 0/0 character device.
    pub whiteout: bool,
    pub children: BTreeMap<OsString, usize>,
    pub nlink: u32,
    /// Its chunks, `Tree::chunks[first..end]`.
    pub chunks: (usize, usize),
    /// Where its bytes start in the cache file.
    pub base: u64,
}

/// A piece of a file: `size` bytes at `file_offset`, the first bytes of the gzip member at
/// `blob_offset..blob_end` after `inner_offset` of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub node: usize,
    pub file_offset: u64,
    pub size: u64,
    pub blob_offset: u64,
    pub blob_end: u64,
    pub inner_offset: u64,
    pub digest: Digest,
}

impl Chunk {
    /// Where a fetch of its member stops: its bytes, deflate's worst case for them and a gzip
    /// header past its start (only the member's start holds the chunk; later entries' headers
    /// may follow in it), never past `blob_end`. Saturating: the offsets are the TOC's.
    pub fn fetch_end(&self) -> u64 {
        self.blob_offset
            .saturating_add(self.size)
            .saturating_add(self.size / 1000)
            .saturating_add(MEMBER_SLACK)
            .min(self.blob_end)
    }
}

#[derive(Debug, Clone)]
pub struct Tree {
    pub nodes: Vec<Node>,
    pub chunks: Vec<Chunk>,
    /// The cache file's length: every file's bytes, one after another.
    pub cache_size: u64,
}

fn node(kind: Kind, mode: u32) -> Node {
    Node {
        kind,
        mode,
        uid: 0,
        gid: 0,
        mtime: 0,
        size: 0,
        rdev: (0, 0),
        target: OsString::new(),
        xattrs: Vec::new(),
        opaque: false,
        whiteout: false,
        children: BTreeMap::new(),
        nlink: 1,
        chunks: (0, 0),
        base: 0,
    }
}

/// The components of an entry's name: no `..`, no NUL, none longer than 255 bytes.
fn components(name: &str) -> Result<Vec<&str>, Refusal> {
    if name.len() > 4096 || name.contains('\0') {
        return Err(Refusal::Name("name too long or holding NUL"));
    }
    let mut out = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(Refusal::Name("`..` in the name")),
            c if c.len() > 255 => return Err(Refusal::Name("a component longer than 255 bytes")),
            c => out.push(c),
        }
    }
    Ok(out)
}

impl Tree {
    /// Parses and checks a TOC; `toc_offset` bounds every chunk's extent.
    /// Device nodes other than whiteouts are refused unless `allow_devices` (as the unpacker
    /// refuses them).
    pub fn parse(json: &[u8], toc_offset: u64, allow_devices: bool) -> Result<Tree, TocError> {
        let raw: RawToc = serde_json::from_slice(json)?;
        if raw.version != 1 {
            return Err(TocError::Version(raw.version));
        }
        if raw.entries.len() > MAX_ENTRIES {
            return Err(TocError::Entries(raw.entries.len()));
        }
        let mut b = Builder {
            tree: Tree {
                nodes: vec![{
                    let mut root = node(Kind::Dir, 0o755);
                    root.nlink = 2;
                    root
                }],
                chunks: Vec::new(),
                cache_size: 0,
            },
            open: None,
            allow_devices,
            last_offset: 0,
        };
        for (index, e) in raw.entries.iter().enumerate() {
            b.entry(e).map_err(|reason| TocError::Entry {
                index,
                name: e.name.clone(),
                reason,
            })?;
        }
        b.close_file().map_err(TocError::Last)?;
        b.tree.place(toc_offset)?;
        Ok(b.tree)
    }

    /// The node `parent` holds under `name`.
    pub fn child(&self, parent: usize, name: &OsStr) -> Option<usize> {
        self.nodes.get(parent)?.children.get(name).copied()
    }

    /// Extents and cache places, once every entry is in.
    fn place(&mut self, toc_offset: u64) -> Result<(), TocError> {
        let mut starts: Vec<u64> = self.chunks.iter().map(|c| c.blob_offset).collect();
        starts.push(toc_offset);
        starts.sort_unstable();
        starts.dedup();
        for c in &mut self.chunks {
            if c.blob_offset >= toc_offset {
                return Err(TocError::PastToc {
                    at: c.blob_offset,
                    toc: toc_offset,
                });
            }
            let i = starts.partition_point(|s| *s <= c.blob_offset);
            c.blob_end = starts[i];
        }
        let mut base = 0u64;
        for n in self.nodes.iter_mut().filter(|n| n.kind == Kind::File) {
            n.base = base;
            base = base.checked_add(n.size).ok_or(TocError::Overflow)?;
        }
        self.cache_size = base;
        Ok(())
    }
}

struct Builder {
    tree: Tree,
    /// The regular file whose chunks are being read: its node and the next chunk's offset.
    open: Option<(usize, u64)>,
    allow_devices: bool,
    /// The last chunk's offset: each chunk has a member of its own, in order.
    last_offset: u64,
}

impl Builder {
    fn entry(&mut self, e: &RawEntry) -> Result<(), Refusal> {
        if e.kind == "chunk" {
            return self.chunk(e);
        }
        self.close_file()?;
        let comps = components(&e.name)?;
        let Some((last, dirs)) = comps.split_last() else {
            if e.kind != "dir" {
                return Err(Refusal::Name("the root is not a directory"));
            }
            let root = &mut self.tree.nodes[0];
            set_attrs(root, e)?;
            return Ok(());
        };
        let parent = self.dirs(dirs)?;
        if *last == ".wh..wh..opq" {
            self.tree.nodes[parent].opaque = true;
            return Ok(());
        }
        if let Some(hidden) = last.strip_prefix(".wh.") {
            if hidden.starts_with(".wh.") {
                // AUFS bookkeeping, as the unpacker treats it.
                return Ok(());
            }
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(Refusal::Name("a whiteout of no usable name"));
            }
            let mut n = node(Kind::Char, 0);
            set_attrs(&mut n, e)?;
            n.mode = 0;
            n.rdev = (0, 0);
            n.whiteout = true;
            return self.put(parent, hidden, n);
        }
        let kind = match e.kind.as_str() {
            "dir" => Kind::Dir,
            "reg" => Kind::File,
            "symlink" => Kind::Symlink,
            "char" => Kind::Char,
            "block" => Kind::Block,
            "fifo" => Kind::Fifo,
            "hardlink" => return self.hardlink(parent, last, &e.link_name),
            other => return Err(Refusal::Kind(other.to_string())),
        };
        if kind == Kind::Dir
            && let Some(existing) = self.tree.child(parent, OsStr::new(last))
            && self.tree.nodes[existing].kind == Kind::Dir
        {
            // A directory named again (its implicit parent first, then its own entry).
            return set_attrs(&mut self.tree.nodes[existing], e);
        }
        let mut n = node(kind, 0);
        set_attrs(&mut n, e)?;
        match kind {
            Kind::Dir => n.nlink = 2,
            Kind::Symlink => {
                if e.link_name.is_empty() || e.link_name.len() > 4096 || e.link_name.contains('\0')
                {
                    return Err(Refusal::Name(
                        "a symlink's target is empty, too long or holds NUL",
                    ));
                }
                n.target = OsString::from(&e.link_name);
                n.size = e.link_name.len() as u64;
            }
            Kind::Char | Kind::Block if !self.allow_devices => {
                return Err(Refusal::Name(
                    "a device node (image.allow_device_nodes is off)",
                ));
            }
            // Served as the kernel's 32-bit device number: a wider one would be cut to another
            // device (4097:1 read as 1:1), where the unpacker's mknod fails.
            Kind::Char | Kind::Block if e.dev_major > MAX_MAJOR || e.dev_minor > MAX_MINOR => {
                return Err(Refusal::DeviceNumber {
                    major: e.dev_major,
                    minor: e.dev_minor,
                });
            }
            Kind::Char | Kind::Block => n.rdev = (e.dev_major, e.dev_minor),
            _ => {}
        }
        let index = self.tree.nodes.len();
        if kind == Kind::File {
            n.size = e.size;
            n.chunks = (self.tree.chunks.len(), self.tree.chunks.len());
        }
        self.put(parent, last, n)?;
        if kind == Kind::File {
            self.open = Some((index, 0));
            if e.size > 0 {
                self.chunk(e)?;
            }
        }
        Ok(())
    }

    /// The directory `dirs` names below the root, made (0755, root-owned) where missing.
    fn dirs(&mut self, dirs: &[&str]) -> Result<usize, Refusal> {
        let mut at = 0;
        for d in dirs {
            at = match self.tree.child(at, OsStr::new(d)) {
                Some(n) if self.tree.nodes[n].kind == Kind::Dir => n,
                Some(_) => return Err(Refusal::NotDir(d.to_string())),
                None => {
                    let mut n = node(Kind::Dir, 0o755);
                    n.nlink = 2;
                    let index = self.tree.nodes.len();
                    self.put(at, d, n)?;
                    index
                }
            };
        }
        Ok(at)
    }

    fn put(&mut self, parent: usize, name: &str, n: Node) -> Result<(), Refusal> {
        if self.tree.nodes.len() > MAX_ENTRIES * 2 {
            return Err(Refusal::TooMany);
        }
        // A whiteout and an entry of one name in one layer: the unpacker's order rules are
        // not repeated here, so such a layer is pulled whole.
        if let Some(old) = self.tree.child(parent, OsStr::new(name))
            && (n.whiteout || self.tree.nodes[old].whiteout)
        {
            return Err(Refusal::Name("a whiteout and an entry of the same name"));
        }
        let is_dir = n.kind == Kind::Dir;
        let index = self.tree.nodes.len();
        self.tree.nodes.push(n);
        self.link(parent, name, index, is_dir);
        Ok(())
    }

    fn link(&mut self, parent: usize, name: &str, index: usize, is_dir: bool) {
        let old = self.tree.nodes[parent]
            .children
            .insert(OsString::from(name), index);
        // A name given again replaces what it held (tar order); the old node stays unreachable.
        if let Some(old) = old {
            let o = &mut self.tree.nodes[old];
            o.nlink = o.nlink.saturating_sub(1);
            if o.kind == Kind::Dir {
                self.tree.nodes[parent].nlink -= 1;
            }
        }
        if is_dir {
            self.tree.nodes[parent].nlink += 1;
        }
    }

    fn hardlink(&mut self, parent: usize, name: &str, target: &str) -> Result<(), Refusal> {
        let comps = components(target)?;
        let mut at = Some(0);
        for c in &comps {
            at = at.and_then(|a| self.tree.child(a, OsStr::new(c)));
        }
        let Some(t) = at.filter(|_| !comps.is_empty()) else {
            // A link to a file of a lower layer cannot be served from this one.
            return Err(Refusal::LinkOut(target.to_string()));
        };
        if self.tree.nodes[t].kind == Kind::Dir {
            return Err(Refusal::LinkDir);
        }
        if self.tree.nodes[t].whiteout
            || self
                .tree
                .child(parent, OsStr::new(name))
                .is_some_and(|old| self.tree.nodes[old].whiteout)
        {
            return Err(Refusal::Name("a whiteout and an entry of the same name"));
        }
        self.tree.nodes[t].nlink += 1;
        self.link(parent, name, t, false);
        Ok(())
    }

    fn chunk(&mut self, e: &RawEntry) -> Result<(), Refusal> {
        let Some((index, next)) = self.open else {
            return Err(Refusal::Chunk("a chunk that follows no regular file"));
        };
        let file = &self.tree.nodes[index];
        if e.chunk_offset != next {
            return Err(Refusal::ChunkOrder {
                at: e.chunk_offset,
                due: next,
            });
        }
        let size = match e.chunk_size {
            0 => file.size - next,
            s => s,
        };
        let end = next
            .checked_add(size)
            .filter(|end| *end <= file.size && size > 0 && size <= MAX_CHUNK)
            .ok_or(Refusal::Chunk("a chunk past the file's end"))?;
        let digest = e.chunk_digest.parse::<Digest>().map_err(Refusal::Digest)?;
        if e.offset <= self.last_offset {
            return Err(Refusal::Chunk(
                "a chunk whose member does not follow the last chunk's",
            ));
        }
        if e.inner_offset != 0 {
            // Chunks sharing a member: not served lazily.
            return Err(Refusal::Chunk("a chunk inside another's member"));
        }
        self.last_offset = e.offset;
        self.tree.chunks.push(Chunk {
            node: index,
            file_offset: next,
            size,
            blob_offset: e.offset,
            blob_end: 0,
            inner_offset: e.inner_offset,
            digest,
        });
        self.tree.nodes[index].chunks.1 = self.tree.chunks.len();
        self.open = Some((index, end));
        Ok(())
    }

    /// The open file's chunks must end at its size.
    fn close_file(&mut self) -> Result<(), Refusal> {
        if let Some((index, next)) = self.open.take() {
            let size = self.tree.nodes[index].size;
            if next != size {
                return Err(Refusal::Uncovered {
                    covered: next,
                    size,
                });
            }
        }
        Ok(())
    }
}

fn set_attrs(n: &mut Node, e: &RawEntry) -> Result<(), Refusal> {
    n.mode = e.mode & 0o7777;
    n.uid = e.uid;
    n.gid = e.gid;
    n.mtime = humantime::parse_rfc3339_weak(&e.modtime)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    n.xattrs.clear();
    for (name, value) in &e.xattrs {
        // Overlay's own attributes are the runtime's to set, never a layer's.
        if name.starts_with("trusted.overlay.") {
            continue;
        }
        if name.is_empty() || name.len() > 255 || name.contains('\0') {
            return Err(Refusal::Name("an extended attribute's name"));
        }
        let value = base64::engine::general_purpose::STANDARD
            .decode(value)
            .map_err(|source| Refusal::Xattr {
                name: name.clone(),
                source,
            })?;
        if value.len() > 65536 {
            return Err(Refusal::Name("an extended attribute's value over 64 KiB"));
        }
        n.xattrs
            .push((OsString::from_vec(name.as_bytes().to_vec()), value));
    }
    Ok(())
}

/// Reads a chunk's bytes out of its gzip member (`member` is the blob's `blob_offset..blob_end`)
/// and checks them against its digest.
pub fn chunk_bytes(chunk: &Chunk, member: &[u8]) -> Result<Vec<u8>, ChunkError> {
    let mut gz = flate2::read::GzDecoder::new(member);
    std::io::copy(
        &mut (&mut gz).take(chunk.inner_offset),
        &mut std::io::sink(),
    )?;
    let mut out = Vec::with_capacity(chunk.size.min(MAX_CHUNK) as usize);
    gz.take(chunk.size).read_to_end(&mut out)?;
    if out.len() as u64 != chunk.size {
        return Err(ChunkError::Short {
            got: out.len() as u64,
            due: chunk.size,
        });
    }
    let got = Digest::of(&out);
    if got != chunk.digest {
        return Err(ChunkError::Digest {
            got,
            want: chunk.digest.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
