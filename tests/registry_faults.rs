//! Pulls from registries that misbehave: busy (503 with Retry-After) and cut mid-layer, hostile
//! manifests (endless, huge, short of their length), blobs redirected to another host, and
//! answers whose Content-Length is not the blob's size; and a client that gives up on a pull
//! mid-layer.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::wire::*;
use common::*;
use crius::cri::v1 as cri;

/// A TCP proxy in front of a registry that fails as networks and busy registries do: the
/// first `busy` HTTP connections are answered 503 with `Retry-After: 1` (TLS hellos, which
/// crius sends first to a loopback registry, are closed unanswered), and the connection that
/// carries the `cut_at`th byte from the registry is cut there, once.
struct FaultyProxy {
    port: u16,
    cuts: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl FaultyProxy {
    fn start(target: u16, busy: u64, cut_at: u64) -> FaultyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let answered_busy = Arc::new(AtomicU64::new(0));
        let (s, c) = (stop.clone(), cuts.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut client) = conn else { continue };
                if !speaks_http(&client) {
                    continue;
                }
                if answered_busy.fetch_add(1, Ordering::Relaxed) < busy {
                    let _ = request_head(&mut client);
                    let _ = client.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
                          Content-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(c2, s2, None));
                let (sent, cuts) = (sent.clone(), c.clone());
                std::thread::spawn(move || {
                    let (mut from, mut to) = (server, client);
                    let mut buf = vec![0u8; 16 << 10];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let before = sent.fetch_add(n as u64, Ordering::Relaxed);
                        if before < cut_at && before + n as u64 >= cut_at {
                            let keep = (cut_at - before) as usize;
                            let _ = to.write_all(&buf[..keep]);
                            cuts.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                    let _ = from.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        FaultyProxy { port, cuts, stop }
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A busy registry (503 with Retry-After, twice) and a connection cut in the middle of a layer:
/// the pull waits as asked, resumes the layer from the bytes that came, verifies it, and
/// succeeds.
#[tokio::test]
async fn pulls_wait_for_busy_registries_and_resume_cut_layers() {
    let reg = Registry::start(None);
    let (img, _) = busybox_and_blob(8 << 20, 11, Compress::None);
    reg.push_image("faulty", "1", &img).await.unwrap();
    let proxy = FaultyProxy::start(reg.port, 2, 5 << 20);
    let d = Daemon::start("");
    let name = format!("127.0.0.1:{}/faulty:1", proxy.port);
    let t = Instant::now();
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "Retry-After was not honoured"
    );
    assert_eq!(
        proxy.cuts.load(Ordering::Relaxed),
        1,
        "the proxy cut a layer"
    );
    let log = d.log_text();
    for want in [
        "registry busy; retrying",
        "layer download interrupted; retrying",
        "resuming layer download",
    ] {
        assert!(log.contains(want), "no {want:?} in the daemon log");
    }
    assert_eq!(d.unpacked_file("blob.bin"), Some(noise(8 << 20, 11)));
    assert!(
        d.blobs().len() == 2,
        "only the manifest and config are kept as blobs"
    );
    assert!(d.ingests().is_empty());
}

/// Not a registry: answers `/v2/`, and for manifests what no real registry can be made to
/// send: an endless chunked body (`endless`), a body of 100 MB (`huge`), a body shorter than
/// its Content-Length (`short`). TLS hellos are closed unanswered (crius then speaks plain
/// HTTP to a loopback registry).
fn hostile_registry() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                if !speaks_http(&c) {
                    return;
                }
                let _ = c.set_write_timeout(Some(Duration::from_secs(30)));
                loop {
                    let Some(head) = request_head(&mut c) else {
                        return;
                    };
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    let chunk = vec![b' '; 64 << 10];
                    if path == "/v2/" {
                        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
                    } else if path.contains("/endless/") {
                        let _ = c.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                              Transfer-Encoding: chunked\r\n\r\n",
                        );
                        // Bounded only so that a runtime that never stops reading ends the test.
                        for _ in 0..4096 {
                            let mut piece = format!("{:x}\r\n", chunk.len()).into_bytes();
                            piece.extend_from_slice(&chunk);
                            piece.extend_from_slice(b"\r\n");
                            if c.write_all(&piece).is_err() {
                                return;
                            }
                        }
                        return;
                    } else if path.contains("/huge/") {
                        let _ = c.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                              Content-Length: 104857600\r\n\r\n",
                        );
                        for _ in 0..1600 {
                            if c.write_all(&chunk).is_err() {
                                return;
                            }
                        }
                        return;
                    } else if path.contains("/short/") {
                        let _ = c.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                              Content-Length: 100000\r\n\r\n{\"schemaVersion\": 2,",
                        );
                        return;
                    } else {
                        let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                    }
                }
            });
        }
    });
    port
}

/// Manifests no registry should send: an endless body and a 100 MB one are refused at the
/// 4 MiB limit, a body cut short of its length is an error naming the registry; each quickly,
/// without the daemon's memory growing, and the daemon serves on.
#[tokio::test]
async fn hostile_manifests_are_refused_with_memory_flat() {
    let port = hostile_registry();
    let d = Daemon::start("");
    let rss = || rss_kib(d.pid().unwrap());
    let before = rss();
    for (name, want) in [
        ("endless", "larger than the 4194304-byte limit"),
        ("huge", "larger than the 4194304-byte limit"),
        ("short", &format!("127.0.0.1:{port}")),
    ] {
        let t = Instant::now();
        let err = d
            .pull(&format!("127.0.0.1:{port}/{name}:1"))
            .await
            .unwrap_err();
        assert!(err.message().contains(want), "{name}: {err:?}");
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{name}: took {:?}",
            t.elapsed()
        );
    }
    let grown = rss() - before;
    assert!(grown < 16 << 10, "the daemon grew by {grown} KiB");
    assert!(d.list_images().await.is_empty());
    d.runtime()
        .version(cri::VersionRequest::default())
        .await
        .unwrap();
}

/// An HTTP front for a registry, one request per connection: requests for the blobs in
/// `redirect` are answered 307 to `localhost:<store>` (another host, as registries send
/// layers to a CDN); the rest go to the registry.
fn redirecting_front(registry: u16, store: u16, redirect: Vec<String>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut client) = conn else { continue };
            let redirect = redirect.clone();
            std::thread::spawn(move || {
                if !speaks_http(&client) {
                    return;
                }
                let Some(head) = request_head(&mut client) else {
                    return;
                };
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                if let Some(hex) = redirect.iter().find(|h| path.ends_with(h.as_str())) {
                    let _ = write!(
                        client,
                        "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://localhost:{store}/cdn/{hex}?sig=1\r\n\
                         Content-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    return;
                }
                forward(&head, client, registry);
            });
        }
    });
    port
}

/// How the blob store answers.
#[derive(Clone, Copy)]
enum Store {
    /// The first answer is 200 with a Content-Length of half the blob, and only that half;
    /// later ones honour Range.
    HalfFirst,
    /// Every answer claims, and sends, 4 KiB more than the blob.
    Longer,
}

/// A CDN for blobs: serves `blobs` by hex digest as `how` says and counts the requests that
/// came with an Authorization header (none should: it was the registry's).
fn blob_store(blobs: Vec<(String, Vec<u8>)>, how: Store) -> (u16, Arc<AtomicU64>, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicU64::new(0));
    let with_auth = Arc::new(AtomicU64::new(0));
    let (req, auth) = (requests.clone(), with_auth.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let Some(head) = request_head(&mut c) else {
                continue;
            };
            let n = req.fetch_add(1, Ordering::SeqCst);
            let lower = head.to_ascii_lowercase();
            if lower.contains("\r\nauthorization:") {
                auth.fetch_add(1, Ordering::SeqCst);
            }
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let Some((_, data)) = blobs.iter().find(|(h, _)| path.contains(h.as_str())) else {
                let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                continue;
            };
            let from: usize = lower
                .lines()
                .find_map(|l| l.strip_prefix("range: bytes="))
                .and_then(|r| r.trim().trim_end_matches('-').parse().ok())
                .unwrap_or(0);
            let len = data.len();
            let _ = match how {
                Store::HalfFirst if n == 0 => {
                    let half = len / 2;
                    write!(
                        c,
                        "HTTP/1.1 200 OK\r\nContent-Length: {half}\r\nConnection: close\r\n\r\n"
                    )
                    .and_then(|()| c.write_all(&data[..half]))
                }
                Store::HalfFirst if from > 0 => write!(
                    c,
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{}/{len}\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n",
                    len - 1,
                    len - from
                )
                .and_then(|()| c.write_all(&data[from..])),
                Store::HalfFirst => write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                )
                .and_then(|()| c.write_all(data)),
                Store::Longer => write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    len + 4096
                )
                .and_then(|()| c.write_all(data))
                .and_then(|()| c.write_all(&[0u8; 4096])),
            };
        }
    });
    (port, requests, with_auth)
}

/// A registry that sends a layer to another host (a CDN) by redirect: the pull follows it
/// without taking the registry's credentials along. That host's first answer is half the
/// layer with a Content-Length to match: the pull takes it for the broken transfer it is and
/// resumes with a Range request. A host that sends more than the layer's size is refused,
/// naming the blob, and nothing of it is kept.
#[tokio::test]
async fn blobs_redirected_elsewhere_and_answers_of_the_wrong_length() {
    let reg = Registry::start(Some(("puller", "s3cret")));
    let auth = cri::AuthConfig {
        username: "puller".into(),
        password: "s3cret".into(),
        ..Default::default()
    };
    let d = Daemon::start("");
    for (how, tag) in [(Store::HalfFirst, "half"), (Store::Longer, "longer")] {
        let big = layer(
            &[Entry::File(
                "blob.bin".into(),
                noise(4 << 20, tag.len() as u64),
                0o644,
            )],
            Compress::None,
        );
        let img = image(
            vec![busybox_layer(Compress::Gzip), big.clone()],
            &ImageOpts::default(),
        );
        reg.push_image("cdn", tag, &img).await.unwrap();
        let hex = big.digest.trim_start_matches("sha256:").to_string();
        let (store, requests, with_auth) = blob_store(vec![(hex.clone(), big.blob.clone())], how);
        let front = redirecting_front(reg.port, store, vec![hex.clone()]);
        let name = format!("127.0.0.1:{front}/cdn:{tag}");
        let pulled = d.pull_with(&name, Some(auth.clone())).await;
        assert!(
            requests.load(Ordering::SeqCst) >= 1,
            "{tag}: the redirect was not followed"
        );
        assert_eq!(
            with_auth.load(Ordering::SeqCst),
            0,
            "{tag}: the registry's credentials went to another host"
        );
        match how {
            Store::HalfFirst => {
                assert_eq!(pulled.unwrap(), img.config_digest);
                assert!(requests.load(Ordering::SeqCst) >= 2, "no second request");
                let log = d.log_text();
                assert!(
                    log.contains("ended after"),
                    "the short answer was not named"
                );
                assert!(
                    log.contains("resuming layer download"),
                    "the layer was not resumed"
                );
                assert_eq!(
                    d.unpacked_file("blob.bin"),
                    Some(noise(4 << 20, tag.len() as u64))
                );
                assert!(!d.blobs().contains(&hex), "the layer is kept unpacked only");
            }
            Store::Longer => {
                let err = pulled.unwrap_err();
                assert!(err.message().contains(&hex[..12]), "{err:?}");
                assert!(
                    !d.blobs().contains(&hex),
                    "an unverified blob was committed"
                );
                assert!(d.ingests().is_empty(), "{:?}", d.ingests());
            }
        }
    }
}

/// A client that gives up on a pull (its deadline, a cancelled request) while a layer is still
/// unpacking, and pulls again at once: the first unpacker runs to its end alone (the second pull
/// waits for it, then resumes its download or finds the layer landed) instead of a second
/// writer opening the same
/// download under it, which failed one of them ('content store ...: No such file').
#[tokio::test]
async fn a_pull_given_up_mid_unpack_and_pulled_again() {
    let reg = Registry::start(None);
    // Small to download, long to write out: the unpacker is busy well after the last byte.
    let big = layer(
        &[Entry::File("zeros.bin".into(), vec![0; 192 << 20], 0o644)],
        Compress::Gzip,
    );
    let img = image(
        vec![busybox_layer(Compress::Gzip), big.clone()],
        &ImageOpts::default(),
    );
    reg.push_image("zeros", "1", &img).await.unwrap();
    let d = Daemon::start("");
    let name = format!("{}/zeros:1", reg.host());

    let first = {
        let mut images = d.images();
        let name = name.clone();
        tokio::spawn(async move {
            images
                .pull_image(cri::PullImageRequest {
                    image: Some(cri::ImageSpec {
                        image: name,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
        })
    };
    // Give up once the big layer is being written out.
    let ingest = d.root.join("snapshots/ingest");
    let written = || -> u64 {
        walk(&ingest)
            .iter()
            .filter_map(|p| std::fs::symlink_metadata(p).ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    };
    let start = Instant::now();
    while written() < (16 << 20) {
        assert!(
            start.elapsed() < Duration::from_secs(60) && !first.is_finished(),
            "the big layer never started unpacking"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.abort();
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);

    assert!(
        !d.blobs()
            .contains(&big.digest.trim_start_matches("sha256:").to_string())
    );
    assert_eq!(d.snapshots().len(), 2, "one snapshot per layer");
    assert!(d.ingests().is_empty());
    assert_eq!(written(), 0, "no half-unpacked layer remains");
    // The first download stops where its client gave up (only a few chunks wait in memory),
    // so the second pull resumes from what the first one wrote, or finds the layer landed.
    let gets = reg.requests("GET", &format!("/v2/zeros/blobs/{}", big.digest));
    assert!(
        gets == 1 || (gets == 2 && d.log_text().contains("resuming layer download")),
        "the second pull started over ({gets} downloads)"
    );
}

/// Every path under `dir`, depth first.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// A layer blob an older crius kept (it committed layers as blobs) is unpacked from the disk
/// rather than downloaded again, and goes at the next garbage collection while its image stays.
#[tokio::test]
async fn a_layer_blob_an_older_crius_kept_is_used_then_collected() {
    let reg = Registry::start(None);
    let (img, big) = busybox_and_blob(1 << 20, 3, Compress::Gzip);
    reg.push_image("legacy", "1", &img).await.unwrap();
    let other = image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default());
    reg.push_image("other", "1", &other).await.unwrap();
    let d = Daemon::start("");
    let hex = big.digest.trim_start_matches("sha256:").to_string();
    std::fs::write(d.root.join("content/blobs/sha256").join(&hex), &big.blob).unwrap();

    let name = format!("{}/legacy:1", reg.host());
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);
    assert_eq!(
        reg.requests("GET", &format!("/v2/legacy/blobs/{}", big.digest)),
        0,
        "the kept blob was downloaded again"
    );
    assert_eq!(d.unpacked_file("blob.bin"), Some(noise(1 << 20, 3)));

    // Removing another image collects garbage: the old blob goes, the image and its layers stay.
    let second = format!("{}/other:1", reg.host());
    d.pull(&second).await.unwrap();
    d.remove_image(&second).await.unwrap();
    assert!(!d.blobs().contains(&hex), "the old layer blob was kept");
    assert!(d.image_status(&name).await.is_some());
    assert_eq!(d.unpacked_file("blob.bin"), Some(noise(1 << 20, 3)));
    assert!(d.ingests().is_empty());
}
