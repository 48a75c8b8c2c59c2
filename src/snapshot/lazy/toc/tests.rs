use std::io::Write;

use super::*;

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn footer(offset: u64) -> Vec<u8> {
    let mut f = vec![
        0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 255, 26, 0, b'S', b'G', 22, 0,
    ];
    f.extend_from_slice(format!("{offset:016x}STARGZ").as_bytes());
    f.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    f
}

fn tree(entries: serde_json::Value) -> Result<Tree, TocError> {
    let json = serde_json::json!({"version": 1, "entries": entries});
    Tree::parse(&serde_json::to_vec(&json).unwrap(), 1000, false)
}

fn digest(data: &[u8]) -> String {
    Digest::of(data).to_string()
}

#[test]
fn the_footer_gives_the_toc_offset() {
    let f = footer(0x1234);
    assert_eq!(f.len() as u64, FOOTER_SIZE);
    assert_eq!(toc_offset(&f).unwrap(), 0x1234);
    let mut bad = f.clone();
    bad[33] = b'X';
    assert!(toc_offset(&bad).is_err());
    assert!(toc_offset(&f[1..]).is_err());
}

#[test]
fn a_tree_in_overlay_form() {
    let t = tree(serde_json::json!([
        {"name": "etc/", "type": "dir", "mode": 0o755},
        {"name": "etc/big", "type": "reg", "size": 10, "mode": 0o4755, "uid": 5,
         "offset": 10, "chunkSize": 6, "chunkDigest": digest(b"aaaaaa")},
        {"name": "etc/big", "type": "chunk", "offset": 50, "chunkOffset": 6, "chunkSize": 4,
         "chunkDigest": digest(b"bbbb")},
        {"name": "etc/empty", "type": "reg"},
        {"name": "etc/link", "type": "hardlink", "linkName": "etc/big"},
        {"name": "usr/bin/sh", "type": "symlink", "linkName": "busybox"},
        {"name": "var/.wh.gone", "type": "reg"},
        {"name": "opt/.wh..wh..opq", "type": "reg"},
        {"name": "x", "type": "reg", "size": 1, "offset": 80, "chunkDigest": digest(b"x"),
         "xattrs": {"user.a": "aGk=", "trusted.overlay.redirect": "eA=="}},
    ]))
    .unwrap();
    let at = |path: &str| {
        path.split('/')
            .try_fold(0, |n, c| t.child(n, OsStr::new(c)))
            .unwrap()
    };
    let big = &t.nodes[at("etc/big")];
    assert_eq!(
        (big.kind, big.mode, big.uid, big.size, big.nlink),
        (Kind::File, 0o4755, 5, 10, 2)
    );
    assert_eq!(at("etc/link"), at("etc/big"));
    let chunks = &t.chunks[big.chunks.0..big.chunks.1];
    assert_eq!(chunks.len(), 2);
    assert_eq!((chunks[0].blob_offset, chunks[0].blob_end), (10, 50));
    assert_eq!((chunks[1].file_offset, chunks[1].blob_end), (6, 80));
    let x = &t.nodes[at("x")];
    assert_eq!(
        t.chunks[x.chunks.0].blob_end, 1000,
        "the last chunk ends at the TOC"
    );
    assert_eq!(x.xattrs, vec![(OsString::from("user.a"), b"hi".to_vec())]);
    let gone = &t.nodes[at("var/gone")];
    assert_eq!((gone.kind, gone.rdev), (Kind::Char, (0, 0)));
    assert!(t.nodes[at("opt")].opaque);
    assert_eq!(t.nodes[at("usr/bin/sh")].target, OsString::from("busybox"));
    assert_eq!(t.nodes[at("etc/empty")].size, 0);
    assert_eq!(t.cache_size, 11);
    assert_eq!(t.nodes[0].nlink, 2 + 4, "root links: etc, usr, var, opt");
}

#[test]
fn hostile_tocs_are_refused() {
    let d = digest(b"a");
    for (entries, why) in [
        (serde_json::json!([{"name": "../x", "type": "reg"}]), "`..`"),
        (
            serde_json::json!([{"name": "a", "type": "reg", "size": 4, "offset": 1, "chunkSize": 2, "chunkDigest": d}]),
            "cover 2 of its 4",
        ),
        (
            serde_json::json!([{"name": "a", "type": "reg", "size": 2, "offset": 1, "chunkSize": 3, "chunkDigest": d}]),
            "past the file's end",
        ),
        (
            serde_json::json!([{"name": "a", "type": "hardlink", "linkName": "lower/file"}]),
            "not in this layer",
        ),
        (
            serde_json::json!([{"name": "a", "type": "reg", "size": 1, "offset": 2000, "chunkDigest": d}]),
            "not before the TOC",
        ),
        (
            serde_json::json!([{"name": "a", "type": "chunk"}]),
            "follows no regular file",
        ),
        (
            serde_json::json!([{"name": "a", "type": "reg", "size": 1, "chunkDigest": d}]),
            "does not follow",
        ),
        (
            serde_json::json!([{"name": "a", "type": "reg"}, {"name": "a/b", "type": "reg"}]),
            "not a directory",
        ),
        (
            serde_json::json!([{"name": "a", "type": "reg", "size": 200000000, "offset": 1, "chunkDigest": d}]),
            "past the file's end",
        ),
        (
            serde_json::json!([{"name": "dev/sda", "type": "block", "devMajor": 8}]),
            "a device node",
        ),
        (
            serde_json::json!([{"name": "a", "type": "reg"}, {"name": ".wh.a", "type": "reg"}]),
            "a whiteout and an entry",
        ),
        (
            serde_json::json!([{"name": ".wh.a", "type": "reg"}, {"name": "a", "type": "dir"}]),
            "a whiteout and an entry",
        ),
        (
            serde_json::json!([
                {"name": "b", "type": "reg"},
                {"name": ".wh.a", "type": "reg"},
                {"name": "a", "type": "hardlink", "linkName": "b"},
            ]),
            "a whiteout and an entry",
        ),
        (
            serde_json::json!([
                {"name": "a", "type": "reg", "size": 1, "offset": 5, "chunkDigest": d},
                {"name": "b", "type": "reg", "size": 1, "offset": 5, "chunkDigest": d},
            ]),
            "does not follow",
        ),
        (
            serde_json::json!([{"name": "a", "type": "reg", "size": 1, "offset": 5, "innerOffset": 9, "chunkDigest": d}]),
            "inside another's member",
        ),
        (
            serde_json::json!([{"name": "a", "type": "dir", "xattrs": {"": "eA=="}}]),
            "extended attribute",
        ),
        (
            serde_json::Value::Array(vec![serde_json::json!({}); MAX_ENTRIES + 1]),
            "more than",
        ),
    ] {
        let err = tree(entries).unwrap_err().to_string();
        assert!(err.contains(why), "{why}: {err}");
    }
}

#[test]
fn the_toc_member_and_a_chunk_are_read_and_checked() {
    let json = br#"{"version":1,"entries":[]}"#;
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(json.len() as u64);
    h.set_mode(0o644);
    tar.append_data(&mut h, TOC_NAME, &json[..]).unwrap();
    let member = gz(&tar.into_inner().unwrap());
    assert_eq!(toc_json(&member).unwrap(), json);

    let mut chunk = Chunk {
        node: 0,
        file_offset: 0,
        size: 3,
        blob_offset: 1,
        blob_end: 2,
        inner_offset: 2,
        digest: Digest::of(b"cde"),
    };
    let member = gz(b"abcdefg");
    assert_eq!(chunk_bytes(&chunk, &member).unwrap(), b"cde");
    chunk.digest = Digest::of(b"xyz");
    assert!(
        chunk_bytes(&chunk, &member)
            .unwrap_err()
            .to_string()
            .contains("digest")
    );
    chunk.size = 30;
    assert!(matches!(
        chunk_bytes(&chunk, &member),
        Err(ChunkError::Short { got: 5, due: 30 })
    ));
}

#[test]
fn device_numbers_past_the_kernels_are_refused() {
    let parse = |major: u32, minor: u32| {
        let json = serde_json::json!({"version": 1, "entries": [
            {"name": "dev/x", "type": "char", "devMajor": major, "devMinor": minor},
        ]});
        Tree::parse(&serde_json::to_vec(&json).unwrap(), 1000, true)
    };
    let t = parse(0xfff, 0xf_ffff).unwrap();
    assert_eq!(t.nodes.last().unwrap().rdev, (0xfff, 0xf_ffff));
    for (major, minor) in [(0x1001, 1), (1, 0x10_0000)] {
        let err = parse(major, minor).unwrap_err().to_string();
        assert!(err.contains("past Linux's device numbers"), "{err}");
    }
}

#[test]
fn a_chunks_fetch_ends_inside_its_member_without_overflow() {
    let mut c = Chunk {
        node: 0,
        file_offset: 0,
        size: 4000,
        blob_offset: 100,
        blob_end: 1 << 30,
        inner_offset: 0,
        digest: Digest::of(b""),
    };
    assert_eq!(c.fetch_end(), 100 + 4000 + 4 + (64 << 10));
    c.blob_end = 200;
    assert_eq!(c.fetch_end(), 200);
    c.blob_offset = u64::MAX - 10;
    c.size = MAX_CHUNK;
    c.blob_end = u64::MAX;
    assert_eq!(c.fetch_end(), u64::MAX);
}
