//! Benchmark images, built here and pushed to a local docker-registry: busybox-static images
//! (one distinct image per cold pull, so no runtime's garbage collection timing matters), a
//! `pause` image for containerd's sandboxes, and large images shaped like AI ones: layers of one
//! incompressible file each (model weights) and a layer of many small files (packages).

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

// The registry push client the tests use too.
#[path = "../../../tests/common/push.rs"]
mod push;
pub use push::sha256;
// The tests' eStargz writer.
#[path = "../../../tests/common/estargz.rs"]
pub mod estargz;

pub struct Layer {
    pub blob: Vec<u8>,
    /// The uncompressed tar's size.
    pub tar_size: u64,
    pub digest: String,
    pub diff_id: String,
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h
}

pub fn gzip_layer(tar: Vec<u8>) -> Result<Layer> {
    let diff_id = sha256(&tar);
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(&tar)?;
    let blob = e.finish()?;
    Ok(Layer {
        digest: sha256(&blob),
        tar_size: tar.len() as u64,
        blob,
        diff_id,
    })
}

/// busybox-static with its applet links, plus a marker file that makes the layer unique.
pub fn busybox_layer(marker: &str) -> Result<Layer> {
    gzip_layer(busybox_tar(marker)?)
}

/// The tar of `busybox_layer`.
pub fn busybox_tar(marker: &str) -> Result<Vec<u8>> {
    let bin = std::fs::read("/bin/busybox")
        .context("/bin/busybox (busybox-static) is missing: run hack/install-bench-deps.sh")?;
    let list = Command::new("/bin/busybox").arg("--list").output()?;
    let mut b = tar::Builder::new(Vec::new());
    for d in ["bin", "etc", "tmp"] {
        b.append_data(&mut header(tar::EntryType::Directory, 0o755, 0), d, &[][..])?;
    }
    b.append_data(
        &mut header(tar::EntryType::Regular, 0o755, bin.len() as u64),
        "bin/busybox",
        &bin[..],
    )?;
    let passwd = b"root:x:0:0:root:/root:/bin/sh\n";
    b.append_data(
        &mut header(tar::EntryType::Regular, 0o644, passwd.len() as u64),
        "etc/passwd",
        &passwd[..],
    )?;
    b.append_data(
        &mut header(tar::EntryType::Regular, 0o644, marker.len() as u64),
        "etc/marker",
        marker.as_bytes(),
    )?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" {
            continue;
        }
        b.append_link(
            &mut header(tar::EntryType::Symlink, 0o777, 0),
            format!("bin/{applet}"),
            "busybox",
        )?;
    }
    Ok(b.into_inner()?)
}

/// xorshift64: a cheap stream of bytes that is the same for the same seed.
struct Xorshift(u64);

impl Xorshift {
    fn new(seed: u64) -> Xorshift {
        Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Deterministic content: 64 KiB blocks, alternately random bytes and text (the seed's parity
/// picks the first), so a set of files compresses to about half, like real code and data do.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = Xorshift::new(seed);
    let words = b"the quick brown fox jumps over the lazy dog while kubelet watches the node ";
    let mut out = Vec::with_capacity(len);
    let mut block = seed & 1;
    while out.len() < len {
        let n = (len - out.len()).min(64 << 10);
        if block.is_multiple_of(2) {
            for _ in 0..n {
                out.push(x.next() as u8);
            }
        } else {
            for i in 0..n {
                out.push(words[(i + block as usize) % words.len()]);
            }
        }
        block += 1;
    }
    out
}

/// Incompressible bytes (xorshift64, a word at a time), like the weights of a model.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = Xorshift::new(seed);
    let mut out = vec![0u8; len];
    for word in out.chunks_mut(8) {
        word.copy_from_slice(&x.next().to_le_bytes()[..word.len()]);
    }
    out
}

/// The tar of a layer holding one file of `mib` MiB of incompressible bytes, like a shard of
/// a model's weights.
pub fn weights_tar(mib: usize, seed: u64) -> Result<Vec<u8>> {
    let data = noise(mib << 20, seed);
    let mut b = tar::Builder::new(Vec::with_capacity(data.len() + (1 << 20)));
    b.append_data(
        &mut header(tar::EntryType::Directory, 0o755, 0),
        "models",
        &[][..],
    )?;
    b.append_data(
        &mut header(tar::EntryType::Regular, 0o644, data.len() as u64),
        format!("models/model-{seed:05}.safetensors"),
        &data[..],
    )?;
    drop(data);
    Ok(b.into_inner()?)
}

/// The tar of a layer of `count` small files (100 to 12,000 bytes, half random and half
/// text) in directories of 100, like the packages of a Python environment.
pub fn packages_tar(count: usize, seed: u64) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let root = "usr/lib/python3/site-packages";
    let mut made = String::new();
    for part in root.split('/') {
        made = if made.is_empty() {
            part.to_string()
        } else {
            format!("{made}/{part}")
        };
        b.append_data(
            &mut header(tar::EntryType::Directory, 0o755, 0),
            &made,
            &[][..],
        )?;
    }
    let mut sizes = Xorshift::new(seed);
    for i in 0..count {
        if i % 100 == 0 {
            b.append_data(
                &mut header(tar::EntryType::Directory, 0o755, 0),
                format!("{root}/pkg{}", i / 100),
                &[][..],
            )?;
        }
        let data = content(
            100 + (sizes.next() % 11_900) as usize,
            seed * 1_000_000 + i as u64,
        );
        b.append_data(
            &mut header(tar::EntryType::Regular, 0o644, data.len() as u64),
            format!("{root}/pkg{}/mod{}.py", i / 100, i % 100),
            &data[..],
        )?;
    }
    Ok(b.into_inner()?)
}

/// A layer of `count` small files (64 to 575 bytes) side by side in one directory.
pub fn one_directory_tar(count: usize, seed: u64) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(
        &mut header(tar::EntryType::Directory, 0o755, 0),
        "many",
        &[][..],
    )?;
    let mut sizes = Xorshift::new(seed);
    for i in 0..count {
        let data = content(
            64 + (sizes.next() % 512) as usize,
            seed * 1_000_000 + i as u64,
        );
        b.append_data(
            &mut header(tar::EntryType::Regular, 0o644, data.len() as u64),
            format!("many/{i:06}"),
            &data[..],
        )?;
    }
    Ok(b.into_inner()?)
}

pub struct Image {
    pub layers: Vec<Layer>,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
}

pub fn image(layers: Vec<Layer>, cmd: &[&str]) -> Image {
    annotated_image(layers, cmd, &[])
}

/// An image whose layers carry these annotations (an eStargz image's TOC digests), one list
/// per layer.
pub fn annotated_image(
    layers: Vec<Layer>,
    cmd: &[&str],
    annotations: &[serde_json::Value],
) -> Image {
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Cmd": cmd, "Env": ["PATH=/bin"] },
        "rootfs": { "type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>() },
    }))
    .unwrap_or_default();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&config), "size": config.len() },
        "layers": layers.iter().enumerate().map(|(i, l)| {
            let mut d = serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": l.digest, "size": l.blob.len()
            });
            if let Some(a) = annotations.get(i) {
                d["annotations"] = a.clone();
            }
            d
        }).collect::<Vec<_>>(),
    }))
    .unwrap_or_default();
    Image {
        layers,
        config,
        manifest,
    }
}

/// Debian's docker-registry on a random loopback port.
pub struct Registry {
    child: Child,
    pub port: u16,
    client: reqwest::Client,
}

impl Registry {
    pub fn start(dir: &Path) -> Result<Registry> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        std::fs::create_dir_all(dir)?;
        let cfg = dir.join("config.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(log.try_clone()?)
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .context("starting docker-registry (run hack/install-bench-deps.sh)")?;
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                bail!("docker-registry did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Registry {
            child,
            port,
            client: reqwest::Client::new(),
        })
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Pushes an image; returns its reference.
    pub async fn push(&self, repo: &str, tag: &str, img: &Image) -> Result<String> {
        let base = format!("http://{}", self.host());
        let anonymous = |rb| rb;
        for blob in img.layers.iter().map(|l| &l.blob).chain([&img.config]) {
            push::blob(&self.client, &base, repo, blob, &anonymous).await?;
        }
        push::manifest(
            &self.client,
            &base,
            repo,
            tag,
            "application/vnd.oci.image.manifest.v1+json",
            &img.manifest,
            &anonymous,
        )
        .await?;
        Ok(format!("{}/{repo}:{tag}", self.host()))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
