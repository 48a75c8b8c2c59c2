//! The large-image rows. Each round pushes a new image shaped like an AI one (`--large-mb` MiB
//! of model weights in four gzip layers of one incompressible file each, and a layer of 20,000
//! small files), and each runtime pulls it cold: the pull's time, the daemon's peak RSS during
//! it, and the bytes the daemon wrote. Beside them, the floor this machine sets for such a pull,
//! measured in the same round: loopback read, gunzip and SHA-256 on one core, disk write.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::Rt;
use super::images::{self, Registry};
use super::report::Results;

/// Files in the packages layer.
pub const SMALL_FILES: usize = 20_000;
/// Layers of weights.
const SHARDS: usize = 4;

/// One round's image, pushed.
pub struct Large {
    pub reference: String,
    /// The same image as eStargz, with a busybox layer to run.
    pub lazy_reference: String,
    /// The first shard's digest: the blob the floor is measured with.
    probe: String,
    /// Compressed and uncompressed bytes of all layers.
    compressed: u64,
    uncompressed: u64,
}

/// The rows' names, which carry the image's shape.
pub fn label(mib: usize) -> String {
    format!("cold pull AI-shaped image ({mib} MiB weights + {SMALL_FILES} files)")
}

/// Builds and pushes one image per round; the layers of a round are made side by side.
pub async fn build(registry: &Registry, mib: usize, rounds: usize) -> Result<Vec<Large>> {
    let mut out = Vec::new();
    for r in 0..rounds {
        let seed = (r as u64 + 1) * 100;
        let started = Instant::now();
        type Both = (images::Layer, Lazy);
        let both = std::thread::scope(|s| -> Result<Vec<Both>> {
            let shards: Vec<_> = (0..SHARDS as u64)
                .map(|l| s.spawn(move || both(images::weights_tar(mib / SHARDS, seed + l)?)))
                .collect();
            let packages = both(images::packages_tar(SMALL_FILES, seed + 50)?)?;
            let mut layers = Vec::new();
            for h in shards {
                layers.push(
                    h.join()
                        .map_err(|_| anyhow::anyhow!("a layer panicked"))??,
                );
            }
            layers.push(packages);
            Ok(layers)
        })?;
        let (layers, lazy): (Vec<_>, Vec<_>) = both.into_iter().unzip();
        let lazy_reference = push_lazy(registry, r, lazy).await?;
        let uncompressed = layers.iter().map(|l| l.tar_size).sum();
        let img = images::image(layers, &["sh"]);
        let compressed = img.layers.iter().map(|l| l.blob.len() as u64).sum::<u64>();
        let built = started.elapsed().as_secs_f64();
        let reference = registry.push("large", &format!("r{r}"), &img).await?;
        eprintln!(
            "bench: AI-shaped image {r}: {} MiB compressed, {} MiB unpacked; built in {built:.0} s, \
             pushed in {:.0} s",
            compressed >> 20,
            uncompressed >> 20,
            started.elapsed().as_secs_f64() - built
        );
        out.push(Large {
            reference,
            lazy_reference,
            probe: img.layers[0].digest.clone(),
            compressed,
            uncompressed,
        });
    }
    Ok(out)
}

/// An eStargz layer and its annotations.
type Lazy = (images::Layer, serde_json::Value);

/// A layer as gzip and as eStargz (4 MiB chunks, as eStargz tools make them).
fn both(tar: Vec<u8>) -> Result<(images::Layer, Lazy)> {
    let lazy = lazy_layer(&tar)?;
    Ok((images::gzip_layer(tar)?, lazy))
}

/// A layer as eStargz, with the annotations eStargz tools give it.
fn lazy_layer(tar: &[u8]) -> Result<Lazy> {
    let e = images::estargz::convert(tar, 4 << 20)?;
    let annotations = serde_json::json!({
        images::estargz::TOC_DIGEST_ANNOTATION: e.toc_digest,
        images::estargz::UNCOMPRESSED_SIZE_ANNOTATION: e.uncompressed_size.to_string(),
    });
    let layer = images::Layer {
        digest: images::sha256(&e.blob),
        tar_size: tar.len() as u64,
        blob: e.blob,
        diff_id: e.diff_id,
    };
    Ok((layer, annotations))
}

/// The round's image as eStargz, busybox below it to run a command.
async fn push_lazy(registry: &Registry, r: usize, mut layers: Vec<Lazy>) -> Result<String> {
    let busybox = images::busybox_tar(&format!("large-lazy-{r}"))?;
    layers.insert(0, lazy_layer(&busybox)?);
    let (layers, annotations): (Vec<_>, Vec<_>) = layers.into_iter().unzip();
    let img = images::annotated_image(layers, &["sh"], &annotations);
    registry.push("large-lazy", &format!("r{r}"), &img).await
}

/// Time to a running container of the round's eStargz image, cold: PullImage, then
/// CreateContainer and StartContainer of a command that reads the first MiB of each weights
/// file. crius serves it lazily (`image.lazy_pull`); the containerd peers, without a stargz
/// snapshotter, pull it whole, and so does CRI-O (c/storage's partial pulls are off by
/// default). The pod is made before the clock starts; the image is removed
/// after (crius's lazy layers go with it).
pub async fn lazy_rows(
    rts: &mut [Rt],
    order: &[usize],
    large: &Large,
    mib: usize,
    res: &mut Results,
) -> Result<()> {
    let name = format!("{}: time to a running container, eStargz image", label(mib));
    let cmd = [
        "sh",
        "-c",
        "head -c 1048576 /models/* > /dev/null; sleep 3600",
    ];
    for &i in order {
        let rt = &mut rts[i];
        let (pod, sb) = rt.run_pod().await?;
        let image = large.lazy_reference.clone();
        let (_, ms) = super::timed(async {
            rt.pull(&image).await?;
            rt.start_container_cmd(&pod, &sb, &image, &cmd).await
        })
        .await?;
        rt.remove_pod(&pod).await?;
        rt.remove_image(&image).await?;
        res.add(&name, "ms", rt.name(), ms);
    }
    Ok(())
}

fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs
}

/// The floor for the round's pull: the rates of what every runtime must do with each byte
/// (read it from the registry, hash it, gunzip it, hash the tar, write it), measured on the
/// first shard, and the time the whole image would take at them with every core busy.
pub async fn floor_rows(
    registry: &Registry,
    large: &Large,
    mib: usize,
    dir: &Path,
    res: &mut Results,
) -> Result<()> {
    let url = format!("http://{}/v2/large/blobs/{}", registry.host(), large.probe);
    let t = Instant::now();
    let mut resp = reqwest::get(&url).await?.error_for_status()?;
    let mut blob = Vec::with_capacity(resp.content_length().unwrap_or(0) as usize);
    while let Some(chunk) = resp.chunk().await? {
        blob.extend_from_slice(&chunk);
    }
    let loopback = mib_per_s(blob.len() as u64, t.elapsed().as_secs_f64());

    let t = Instant::now();
    let digest = images::sha256(&blob);
    let sha = mib_per_s(blob.len() as u64, t.elapsed().as_secs_f64());
    if digest != large.probe {
        bail!("the registry served {digest} for {}", large.probe);
    }

    // Decompressed in the pieces a runtime reads, into a buffer that is reused.
    let t = Instant::now();
    let mut gz = flate2::read::MultiGzDecoder::new(&blob[..]);
    let mut buf = vec![0u8; 256 << 10];
    let mut unpacked = 0u64;
    loop {
        let n = gz.read(&mut buf)?;
        if n == 0 {
            break;
        }
        unpacked += n as u64;
    }
    let gunzip = mib_per_s(unpacked, t.elapsed().as_secs_f64());

    // Written where the runtimes keep their layers, to the disk.
    let path = dir.join("floor-write");
    let t = Instant::now();
    {
        let mut f = std::fs::File::create(&path).with_context(|| path.display().to_string())?;
        f.write_all(&blob)?;
        f.sync_all()?;
    }
    let disk = mib_per_s(blob.len() as u64, t.elapsed().as_secs_f64());
    std::fs::remove_file(&path)?;

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (c, u) = (
        large.compressed as f64 / (1 << 20) as f64,
        large.uncompressed as f64 / (1 << 20) as f64,
    );
    // Every compressed byte read and hashed, every tar byte gunzipped and hashed, the cores
    // all busy; what the disk takes is a bound of its own, since no runtime waits for its
    // unpacked files to be written back.
    let cpu = (c / sha + u / gunzip + u / sha) / cores;
    let pull = (c / loopback).max(cpu);
    let name = label(mib);
    for (what, v) in [
        ("loopback read of a shard (MiB/s)", loopback),
        ("gunzip on one core (MiB/s of tar)", gunzip),
        ("SHA-256 on one core (MiB/s)", sha),
        ("disk write + fsync (MiB/s)", disk),
    ] {
        res.add(&format!("{name}, floor: {what}"), "MiB/s", "crius", v);
    }
    res.add(
        &format!("{name}, floor: read, gunzip and hashes at those rates, all cores busy"),
        "ms",
        "crius",
        pull * 1000.0,
    );
    res.add(
        &format!("{name}, floor: every unpacked byte written and fsynced"),
        "ms",
        "crius",
        u / disk * 1000.0,
    );
    Ok(())
}

/// Bytes the process (and the children it reaped) sent toward the disk, less what truncation
/// took back before it was written.
fn written_bytes(pid: i32) -> Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let field = |name: &str| -> Result<u64> {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no {name} in /proc/PID/io"))
    };
    Ok(field("write_bytes:")?.saturating_sub(field("cancelled_write_bytes:")?))
}

/// Each runtime pulls the round's image cold, with the disk quiet before it starts. The images
/// stay until the bench's directory goes: a large delete slows file creation on this disk for
/// about a minute (field notes), which would fall on the next round's pulls.
pub async fn pull_rows(
    rts: &mut [Rt],
    order: &[usize],
    large: &Large,
    mib: usize,
    res: &mut Results,
) -> Result<()> {
    let name = label(mib);
    for &i in order {
        let rt = &mut rts[i];
        let pid = rt.peer.pid;
        // The last pull's dirty pages go out now, not during this one.
        if !std::process::Command::new("sync").status()?.success() {
            bail!("sync failed");
        }
        // "5" resets the peak RSS (VmHWM) to the current RSS (proc(5)).
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
        let before = written_bytes(pid)?;
        let (_, ms) = super::timed(rt.pull(&large.reference)).await?;
        // Peak resident memory since the reset.
        let peak =
            super::peers::status_kib(pid, "VmHWM:").context("no VmHWM in /proc/PID/status")?;
        let wrote = written_bytes(pid)?.saturating_sub(before);
        let who = rt.name();
        res.add(&name, "ms", who, ms);
        res.add(
            &format!("{name}: peak daemon RSS (MiB)"),
            "MiB",
            who,
            peak as f64 / 1024.0,
        );
        res.add(
            &format!("{name}: daemon wrote, per byte unpacked"),
            "x",
            who,
            wrote as f64 / large.uncompressed as f64,
        );
    }
    Ok(())
}
