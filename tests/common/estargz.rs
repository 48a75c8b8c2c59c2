//! eStargz layers, shared by the test harness and the benchmark (`xtask`), which includes this
//! file by path as it does `push.rs`. This file owns the writer, `convert`: an uncompressed tar
//! becomes a blob of gzip members, one holding each entry's header blocks and one starting each
//! chunk of a regular file's payload, then a member holding the table of contents
//! (`stargz.index.json` in a tar of its own), then the 51-byte footer that says where that
//! member starts. It also owns `verify`, which reads a converted layer back the way a lazy
//! reader does (footer, table of contents, each chunk from its own offset) and checks it
//! against the tar it came from.

use std::collections::HashMap;
use std::io::{Read, Write};

use anyhow::{Context, Result, bail, ensure};
use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The layer-descriptor annotation naming the digest of the table of contents.
pub const TOC_DIGEST_ANNOTATION: &str = "containerd.io/snapshot/stargz/toc.digest";
/// The layer-descriptor annotation giving the size of the decompressed blob.
pub const UNCOMPRESSED_SIZE_ANNOTATION: &str = "io.containers.estargz.uncompressed-size";
/// The table of contents' name in the tar of the last member.
pub const TOC_NAME: &str = "stargz.index.json";
/// The footer: an empty gzip member whose extra field holds the table of contents' offset.
pub const FOOTER_SIZE: usize = 51;

/// A converted layer.
pub struct Estargz {
    /// The compressed layer blob.
    pub blob: Vec<u8>,
    /// `sha256:<hex>` of all the members' decompressed bytes, in order.
    pub diff_id: String,
    /// `sha256:<hex>` of the table of contents' JSON, as written in `stargz.index.json`.
    pub toc_digest: String,
    /// How many bytes the members decompress to.
    pub uncompressed_size: u64,
}

/// The blob being written, and what its members decompress to so far.
struct Blob {
    bytes: Vec<u8>,
    diff: Sha256,
    size: u64,
}

impl Blob {
    /// Writes `parts` as one gzip member; returns the offset it starts at.
    fn member(&mut self, parts: &[&[u8]]) -> Result<u64> {
        let at = self.bytes.len() as u64;
        let mut gz = GzEncoder::new(&mut self.bytes, Compression::default());
        for part in parts {
            gz.write_all(part)?;
            self.diff.update(part);
            self.size += part.len() as u64;
        }
        gz.finish()?;
        Ok(at)
    }
}

/// Converts an uncompressed tar (as the tests build them) to eStargz, splitting regular files'
/// payloads into chunks of at most `chunk` bytes. The entries' bytes are the input's own (long
/// names, PAX records and all), without its end-of-archive blocks.
pub fn convert(tar: &[u8], chunk: usize) -> Result<Estargz> {
    ensure!(chunk > 0, "eStargz chunks must hold at least one byte");
    let mut blob = Blob {
        bytes: Vec::with_capacity(tar.len() / 2 + 4096),
        diff: Sha256::new(),
        size: 0,
    };
    let mut toc = Vec::new();
    let mut archive = tar::Archive::new(std::io::Cursor::new(tar));
    // Where the next entry's blocks begin: the extension headers before it (GNU long names, PAX
    // records, global PAX headers too) go into its header member.
    let mut start = 0usize;
    for entry in archive.entries_with_seek()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            continue;
        }
        ensure!(
            !kind.is_gnu_sparse(),
            "sparse tar entries are not supported"
        );
        let data_at = usize::try_from(entry.raw_file_position())?;
        let size = usize::try_from(entry.size())?;
        let end = size
            .checked_next_multiple_of(512)
            .and_then(|padded| padded.checked_add(data_at))
            .filter(|&end| end <= tar.len())
            .context("the tar ends inside an entry")?;
        let (mut meta, regular) = describe(&mut entry, size)?;
        if regular && size > 0 {
            blob.member(&[&tar[start..data_at]])?;
            let more = write_chunks(&mut blob, &tar[data_at..end], size, chunk, &mut meta)?;
            toc.push(Value::Object(meta));
            toc.extend(more);
        } else {
            blob.member(&[&tar[start..end]])?;
            toc.push(Value::Object(meta));
        }
        start = end;
    }
    let toc_json = serde_json::to_vec(&json!({"version": 1, "entries": toc}))?;
    let toc_offset = blob.member(&[&toc_tar(&toc_json)?])?;
    blob.bytes.extend_from_slice(&footer(toc_offset)?);
    Ok(Estargz {
        diff_id: format!("sha256:{}", hex::encode(blob.diff.finalize())),
        toc_digest: super::push::sha256(&toc_json),
        uncompressed_size: blob.size,
        blob: blob.bytes,
    })
}

/// Writes a regular file's payload (`data`: its `size` bytes, then the tar padding) a member per
/// chunk, the padding in the last one. The first chunk's fields go into `meta`, the file's own
/// entry, with the file's digest; the later chunks' entries are returned.
fn write_chunks(
    blob: &mut Blob,
    data: &[u8],
    size: usize,
    chunk: usize,
    meta: &mut Map<String, Value>,
) -> Result<Vec<Value>> {
    let (payload, padding) = data.split_at(size);
    let mut whole = Sha256::new();
    let mut more = Vec::new();
    for (i, piece) in payload.chunks(chunk).enumerate() {
        let at = i * chunk;
        let offset = if at + piece.len() == size {
            blob.member(&[piece, padding])?
        } else {
            blob.member(&[piece])?
        };
        whole.update(piece);
        let mut fields = Map::new();
        fields.insert("offset".into(), offset.into());
        if at > 0 {
            fields.insert("chunkOffset".into(), at.into());
        }
        if size > chunk {
            fields.insert("chunkSize".into(), piece.len().into());
        }
        fields.insert("chunkDigest".into(), super::push::sha256(piece).into());
        if i == 0 {
            meta.extend(fields);
        } else {
            let mut entry = Map::new();
            entry.insert("name".into(), meta["name"].clone());
            entry.insert("type".into(), "chunk".into());
            entry.extend(fields);
            more.push(Value::Object(entry));
        }
    }
    let digest = format!("sha256:{}", hex::encode(whole.finalize()));
    meta.insert("digest".into(), digest.into());
    Ok(more)
}

/// An entry's table-of-contents fields, but for a regular file's chunks; and whether it is a
/// regular file. Fields that are zero or empty are left out.
fn describe<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    size: usize,
) -> Result<(Map<String, Value>, bool)> {
    let mut pax = Vec::new();
    if let Some(records) = entry.pax_extensions()? {
        for record in records {
            let record = record?;
            let key = String::from_utf8_lossy(record.key_bytes()).into_owned();
            pax.push((key, record.value_bytes().to_vec()));
        }
    }
    let find = |key: &str| pax.iter().find(|(k, _)| k == key).map(|(_, v)| &v[..]);
    let h = entry.header();
    use tar::EntryType as T;
    let kind = match h.entry_type() {
        T::Regular | T::Continuous => "reg",
        T::Directory => "dir",
        T::Symlink => "symlink",
        T::Link => "hardlink",
        T::Char => "char",
        T::Block => "block",
        T::Fifo => "fifo",
        other => bail!("tar entry type {other:?} has no eStargz counterpart"),
    };
    let mut m = Map::new();
    m.insert("name".into(), clean(&entry.path_bytes()).into());
    m.insert("type".into(), kind.into());
    if kind == "reg" && size > 0 {
        m.insert("size".into(), size.into());
    }
    let mtime = match find("mtime").and_then(pax_seconds) {
        Some(secs) => secs,
        None => i64::try_from(h.mtime()?)?,
    };
    m.insert("modtime".into(), rfc3339(mtime).into());
    let link = entry.link_name_bytes();
    let link = match (kind, link) {
        ("symlink", Some(target)) => String::from_utf8_lossy(&target).into_owned(),
        ("hardlink", Some(target)) => clean(&target),
        _ => String::new(),
    };
    if !link.is_empty() {
        m.insert("linkName".into(), link.into());
    }
    // Device numbers are read only for devices: other headers may leave them blank.
    let (major, minor) = match kind {
        "char" | "block" => (h.device_major()?, h.device_minor()?),
        _ => (None, None),
    };
    let numbers = [
        ("mode", u64::from(h.mode()? & 0o7777)),
        ("uid", h.uid()?),
        ("gid", h.gid()?),
        ("devMajor", u64::from(major.unwrap_or(0))),
        ("devMinor", u64::from(minor.unwrap_or(0))),
    ];
    for (key, value) in numbers.into_iter().filter(|(_, v)| *v != 0) {
        m.insert(key.into(), value.into());
    }
    let names = [
        ("userName", find("uname").or(h.username_bytes())),
        ("groupName", find("gname").or(h.groupname_bytes())),
    ];
    for (key, value) in names {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            m.insert(key.into(), String::from_utf8_lossy(v).into());
        }
    }
    let mut xattrs = Map::new();
    for (key, value) in &pax {
        if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
            xattrs.insert(name.into(), base64(value).into());
        }
    }
    if !xattrs.is_empty() {
        m.insert("xattrs".into(), xattrs.into());
    }
    Ok((m, kind == "reg"))
}

/// A tar name as the table of contents gives it: no leading `./` or `/`, no trailing slash,
/// `.` and `..` resolved.
fn clean(raw: &[u8]) -> String {
    let name = String::from_utf8_lossy(raw);
    let mut parts: Vec<&str> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

/// The whole seconds of a PAX time (`1700000000.25`).
fn pax_seconds(value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?;
    text.split('.').next()?.parse().ok()
}

/// Seconds since the epoch as RFC 3339 in UTC (`2024-01-02T03:04:05Z`).
fn rfc3339(secs: i64) -> String {
    let (days, time) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // The civil date of a day count: eras of 400 years, years starting in March.
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (time / 3600, time % 3600 / 60, time % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

/// Standard base64 with padding, as the table of contents gives xattr values.
fn base64(data: &[u8]) -> String {
    const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for group in data.chunks(3) {
        let bits = group
            .iter()
            .enumerate()
            .fold(0u32, |bits, (i, b)| bits | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(DIGITS[((bits >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The tar of the last member: `stargz.index.json` holding `json`, and the end blocks.
fn toc_tar(json: &[u8]) -> Result<Vec<u8>> {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(json.len() as u64);
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut h, TOC_NAME, json)?;
    Ok(b.into_inner()?)
}

/// The footer: an empty gzip member whose extra field `SG` says where the TOC member starts.
fn footer(toc_offset: u64) -> Result<Vec<u8>> {
    let mut f = vec![0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 255];
    f.extend_from_slice(&26u16.to_le_bytes());
    f.extend_from_slice(b"SG");
    f.extend_from_slice(&22u16.to_le_bytes());
    f.extend_from_slice(format!("{toc_offset:016x}STARGZ").as_bytes());
    // An empty final stored block, then CRC32 and ISIZE, both zero.
    f.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    ensure!(
        f.len() == FOOTER_SIZE,
        "the footer came out {} bytes",
        f.len()
    );
    Ok(f)
}

/// Reads `layer` back as a lazy reader would and checks it against `tar`, the input it was
/// converted from: the whole stream against the diff ID and the input, the footer, the table of
/// contents against its digest, and every chunk, read alone from its offset, against its digest
/// and the file it belongs to. Returns the table of contents.
#[allow(dead_code)] // the benchmark only converts
pub fn verify(layer: &Estargz, tar: &[u8]) -> Result<Value> {
    let blob = &layer.blob[..];
    let mut stream = Vec::new();
    flate2::read::MultiGzDecoder::new(blob).read_to_end(&mut stream)?;
    ensure!(super::push::sha256(&stream) == layer.diff_id, "the diff ID");
    ensure!(stream.len() as u64 == layer.uncompressed_size, "the size");
    let foot = &blob[blob.len().checked_sub(FOOTER_SIZE).context("too short")?..];
    let mut empty = Vec::new();
    flate2::read::GzDecoder::new(foot)
        .read_to_end(&mut empty)
        .context("the footer is not a gzip member")?;
    ensure!(empty.is_empty() && &foot[12..14] == b"SG" && &foot[32..38] == b"STARGZ");
    let toc_offset = usize::from_str_radix(std::str::from_utf8(&foot[16..32])?, 16)?;
    let mut toc_tar = Vec::new();
    flate2::read::GzDecoder::new(blob.get(toc_offset..).context("TOC offset")?)
        .read_to_end(&mut toc_tar)?;
    // The members before the TOC's decompress to the input without its end blocks.
    let body = stream
        .strip_suffix(&toc_tar[..])
        .context("the stream does not end with the TOC member")?;
    ensure!(tar.starts_with(body) && tar[body.len()..].iter().all(|b| *b == 0));
    let mut toc_json = Vec::new();
    let mut toc_archive = tar::Archive::new(&toc_tar[..]);
    let mut names = Vec::new();
    for entry in toc_archive.entries()? {
        let mut entry = entry?;
        names.push(String::from_utf8_lossy(&entry.path_bytes()).into_owned());
        entry.read_to_end(&mut toc_json)?;
    }
    ensure!(names == [TOC_NAME], "the TOC tar holds {names:?}");
    let blocks = 512 + toc_json.len().next_multiple_of(512) + 1024;
    ensure!(
        toc_tar.len() == blocks && toc_tar.ends_with(&[0; 1024]),
        "the TOC tar's end"
    );
    ensure!(
        super::push::sha256(&toc_json) == layer.toc_digest,
        "the TOC digest"
    );
    let toc: Value = serde_json::from_slice(&toc_json)?;
    let mut wanted = HashMap::new();
    for entry in tar::Archive::new(tar).entries()? {
        let mut entry = entry?;
        if entry.header().entry_type().is_file() {
            let mut data = Vec::new();
            entry.read_to_end(&mut data)?;
            wanted.insert(clean(&entry.path_bytes()), data);
        }
    }
    // Each regular file's size and the chunks read so far.
    let mut read: HashMap<String, (usize, Vec<u8>)> = HashMap::new();
    let entries = toc["entries"].as_array().context("no entries")?;
    for e in entries {
        let name = e["name"].as_str().context("a name")?;
        if e["type"] == "reg" {
            let size = e["size"].as_u64().unwrap_or(0) as usize;
            ensure!(
                (size > 0) == e.get("chunkDigest").is_some(),
                "{name}: chunkDigest"
            );
            ensure!((size > 0) == e.get("offset").is_some(), "{name}: offset");
            read.insert(name.to_string(), (size, Vec::with_capacity(size)));
        }
        let Some(chunk_digest) = e.get("chunkDigest") else {
            continue;
        };
        let offset = e["offset"].as_u64().context("a chunk's offset")? as usize;
        let at = e["chunkOffset"].as_u64().unwrap_or(0) as usize;
        let (size, file) = read.get_mut(name).context("a chunk before its file")?;
        ensure!(
            file.len() == at,
            "{name}: a chunk at {at} after {}",
            file.len()
        );
        let len = match e["chunkSize"].as_u64() {
            Some(n) => n as usize,
            None => size.checked_sub(at).context("a chunk past the end")?,
        };
        let mut piece = vec![0; len];
        flate2::read::GzDecoder::new(blob.get(offset..).context("a chunk's offset")?)
            .read_exact(&mut piece)
            .with_context(|| format!("{name}: the chunk at {at}"))?;
        ensure!(
            super::push::sha256(&piece) == *chunk_digest,
            "{name}: the chunk at {at}"
        );
        file.extend_from_slice(&piece);
    }
    for e in entries.iter().filter(|e| e["type"] == "reg") {
        let name = e["name"].as_str().context("a name")?;
        let (_, content) = read.get(name).context("read")?;
        ensure!(Some(content) == wanted.get(name), "{name}: the content");
        if !content.is_empty() {
            ensure!(
                super::push::sha256(content) == e["digest"],
                "{name}: the digest"
            );
        }
    }
    Ok(toc)
}
