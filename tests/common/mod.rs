//! Test harness shared by the integration tests: a real registry (Debian's `docker-registry` on
//! 127.0.0.1 with a random port), images built here from busybox-static and pushed over the
//! registry API, and the crius daemon run from the test binary with private directories.
//! Integration tests need root; `hack/install-test-deps.sh` installs what they use.

#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use crius::cri::v1 as cri;
use flate2::Compression as GzLevel;
use futures_util::{StreamExt, TryStreamExt};
use tonic::transport::Channel;

pub mod agent;
pub mod estargz;
pub mod ginkgo;
pub mod kubelet;
pub mod net;
pub mod push;
pub mod upstream;
pub mod wire;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "integration tests need root (they mount overlayfs, create namespaces): run them as root"
    );
}

pub use push::sha256;

/// Whether every tool the tests use must be here (CI sets `CRIUS_REQUIRE_ALL=1`): then a test
/// whose tool is missing fails, naming it, instead of passing by skipping.
pub fn require_all() -> bool {
    std::env::var("CRIUS_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Notes a skip where the harness counts them (`CRIUS_SKIP_LOG`, which `cargo xtask` sets and
/// sums up after a tier) and says so in the test's output.
fn note_skip(line: &str) {
    println!("skipped: {line}");
    if let Some(log) = std::env::var_os("CRIUS_SKIP_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
    {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(f, "{test}: {line}");
    }
}

/// A tool the test needs is missing (`what` names it and where it comes from): the test stops
/// here, counted as skipped, or under `CRIUS_REQUIRE_ALL=1` fails.
pub fn missing(what: &str) {
    assert!(!require_all(), "required but missing: {what}");
    note_skip(&format!("missing {what}"));
}

/// The test is not for this machine (`why`: another tier runs it, or it would change what is
/// not the test's): it stops here, counted as skipped, whatever `CRIUS_REQUIRE_ALL` says.
pub fn not_here(why: &str) {
    note_skip(why);
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

fn wait_for<F: FnMut() -> bool>(what: &str, timeout: Duration, mut ok: F) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("timed out waiting for {what}")
}

/// A running docker-registry with its own storage.
pub struct Registry {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub creds: Option<(String, String)>,
    /// Served over TLS with a certificate from this CA (PEM file).
    pub ca: Option<PathBuf>,
    /// Token auth: the issuer the pusher asks for tokens.
    pub token: Option<TokenIssuer>,
    /// The pusher's HTTP client, built once: building one reads the system's root certificates,
    /// about half a second under the VM tier's emulated CPU.
    client: std::sync::OnceLock<reqwest::Client>,
    /// One image push at a time: docker-registry answered a manifest PUT with
    /// MANIFEST_BLOB_UNKNOWN when one image went up under three tags of a repository at once
    /// (the VM tier, 2026-11-29), and pod tests share a registry.
    pushes: tokio::sync::Mutex<()>,
    child: Child,
}

/// How the registry authenticates.
pub enum Auth<'a> {
    None,
    Basic(&'a str, &'a str),
    /// Bearer tokens from a realm that accepts these credentials.
    Token(&'a str, &'a str),
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl (run hack/install-test-deps.sh)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Registry {
    pub fn start(creds: Option<(&str, &str)>) -> Registry {
        match creds {
            Some((u, p)) => Self::start_with(Auth::Basic(u, p), false),
            None => Self::start_with(Auth::None, false),
        }
    }

    /// A registry with the given auth, over TLS (a fresh CA and a certificate for 127.0.0.1) when
    /// `tls` is set.
    pub fn start_with(auth_kind: Auth, tls: bool) -> Registry {
        Self::launch(auth_kind, tls, false)
    }

    /// `for_the_process`: the registry is never dropped, so a keeper shell stops it and removes
    /// its storage when this process ends (see `shared_registry`).
    fn launch(auth_kind: Auth, tls: bool, for_the_process: bool) -> Registry {
        let bin = which("docker-registry")
            .expect("docker-registry is not installed: run hack/install-test-deps.sh");
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut auth = String::new();
        let mut creds = None;
        let mut token = None;
        match auth_kind {
            Auth::None => {}
            Auth::Basic(u, p) => {
                let htpasswd = dir.path().join("htpasswd");
                let out = Command::new("htpasswd")
                    .args(["-Bbn", u, p])
                    .output()
                    .expect(
                        "htpasswd (apache2-utils) is not installed: run hack/install-test-deps.sh",
                    );
                std::fs::write(&htpasswd, out.stdout).expect("write htpasswd");
                auth = format!(
                    "auth:\n  htpasswd:\n    realm: crius-test\n    path: {}\n",
                    htpasswd.display()
                );
                creds = Some((u.to_string(), p.to_string()));
            }
            Auth::Token(u, p) => {
                let issuer = TokenIssuer::start(dir.path(), u, p);
                auth = format!(
                    "auth:\n  token:\n    realm: http://127.0.0.1:{}/token\n    service: crius-registry\n    issuer: crius-test\n    rootcertbundle: {}\n",
                    issuer.port,
                    issuer.cert.display()
                );
                creds = Some((u.to_string(), p.to_string()));
                token = Some(issuer);
            }
        }
        let mut tls_cfg = String::new();
        let mut ca = None;
        if tls {
            let d = dir.path();
            let p = |n: &str| d.join(n).display().to_string();
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=crius test CA",
                "-keyout",
                &p("ca.key"),
                "-out",
                &p("ca.crt"),
            ]);
            openssl(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                &p("server.key"),
                "-out",
                &p("server.csr"),
            ]);
            std::fs::write(d.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("san");
            openssl(&[
                "x509",
                "-req",
                "-in",
                &p("server.csr"),
                "-CA",
                &p("ca.crt"),
                "-CAkey",
                &p("ca.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &p("san.ext"),
                "-out",
                &p("server.crt"),
            ]);
            tls_cfg = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                p("server.crt"),
                p("server.key")
            );
            ca = Some(d.join("ca.crt"));
        }
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{tls_cfg}{auth}",
            dir.path().join("data").display()
        );
        let cfg_path = dir.path().join("config.yml");
        std::fs::write(&cfg_path, config).expect("write registry config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("registry log");
        let mut cmd = if for_the_process {
            // The keeper's stdin is a pipe only this process holds (close-on-exec), so it
            // reads EOF however the process ends, even when killed, and then cleans up.
            let mut keeper = Command::new("sh");
            keeper
                .args([
                    "-c",
                    "\"$0\" serve \"$1\" & reg=$!; trap '' INT TERM HUP; cat >/dev/null; \
                     kill -KILL $reg; wait $reg; rm -rf \"$2\"",
                ])
                .arg(&bin)
                .arg(&cfg_path)
                .arg(dir.path())
                .stdin(Stdio::piped());
            keeper
        } else {
            let mut serve = Command::new(&bin);
            serve.arg("serve").arg(&cfg_path);
            serve
        };
        let child = cmd
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let reg = Registry {
            dir,
            port,
            creds,
            ca,
            token,
            client: std::sync::OnceLock::new(),
            pushes: tokio::sync::Mutex::new(()),
            child,
        };
        wait_for("the registry to listen", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .expect("registry did not start");
        reg
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn client(&self) -> &reqwest::Client {
        self.client.get_or_init(|| {
            // No idle connections kept: a pooled one belongs to the runtime of the test that
            // opened it, and a registry may outlive it.
            let mut b = reqwest::Client::builder().pool_max_idle_per_host(0);
            if let Some(ca) = &self.ca {
                let pem = std::fs::read(ca).expect("ca");
                b = b.add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("ca pem"));
            }
            b.build().expect("client")
        })
    }

    fn base(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.host())
    }

    fn auth(&self, rb: reqwest::RequestBuilder, repo: &str) -> reqwest::RequestBuilder {
        match (&self.token, &self.creds) {
            // The pusher is trusted: it takes a push token straight from the issuer.
            (Some(t), _) => rb.bearer_auth(t.issue("pusher", repo, &["pull", "push"])),
            (None, Some((u, p))) => rb.basic_auth(u, Some(p)),
            (None, None) => rb,
        }
    }

    /// Uploads a blob (monolithic: POST then PUT with the digest) and returns its digest.
    pub async fn push_blob(&self, repo: &str, data: &[u8]) -> Result<String> {
        let auth = |rb| self.auth(rb, repo);
        push::blob(self.client(), &self.base(), repo, data, &auth).await
    }

    pub async fn push_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        data: &[u8],
    ) -> Result<String> {
        let auth = |rb| self.auth(rb, repo);
        push::manifest(
            self.client(),
            &self.base(),
            repo,
            reference,
            media_type,
            data,
            &auth,
        )
        .await
    }

    /// How many `method` requests for `path` the registry has answered (its access log).
    pub fn requests(&self, method: &str, path: &str) -> usize {
        std::fs::read_to_string(self.dir.path().join("registry.log"))
            .unwrap_or_default()
            .matches(&format!("\"{method} {path} HTTP/"))
            .count()
    }

    /// The file holding a blob in the registry's storage (to corrupt it).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Pushes every blob of an image and its manifest under `tag`; returns the manifest digest.
    pub async fn push_image(&self, repo: &str, tag: &str, img: &TestImage) -> Result<String> {
        let _one = self.pushes.lock().await;
        // A few at once: an image of 200 layers took two minutes one blob at a time in the VM.
        futures_util::stream::iter(&img.layers)
            .map(|l| self.push_blob(repo, &l.blob))
            .buffer_unordered(4)
            .try_collect::<Vec<_>>()
            .await?;
        self.push_blob(repo, &img.config).await?;
        self.push_manifest(repo, tag, &img.manifest_type, &img.manifest)
            .await
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // A keeper (a shared registry whose start failed part-way) is told by EOF, so that it
        // stops the registry and removes the storage; killing it would orphan both.
        match self.child.stdin.take() {
            Some(keeper) => drop(keeper),
            None => {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compress {
    Gzip,
    Zstd,
    None,
}

/// One built layer.
#[derive(Clone)]
pub struct TestLayer {
    pub blob: Vec<u8>,
    pub digest: String,
    pub diff_id: String,
    pub media_type: String,
}

/// Entries of a layer tar.
pub enum Entry {
    Dir(String),
    /// A directory with its own mode (`tmp` with 0o1777, say).
    DirMode(String, u32),
    File(String, Vec<u8>, u32),
    Symlink(String, String),
    Whiteout(String),
    Opaque(String),
    /// A hardlink, name and target written into the header as given (a leading `/` too).
    Hardlink(String, String),
}

pub fn layer(entries: &[Entry], compress: Compress) -> TestLayer {
    let mut b = tar::Builder::new(Vec::new());
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h
    };
    for e in entries {
        match e {
            Entry::Dir(p) => {
                let mut h = header(tar::EntryType::Directory, 0o755, 0);
                b.append_data(&mut h, p, &[][..]).expect("dir entry");
            }
            Entry::DirMode(p, mode) => {
                let mut h = header(tar::EntryType::Directory, *mode, 0);
                b.append_data(&mut h, p, &[][..]).expect("dir entry");
            }
            Entry::File(p, data, mode) => {
                let mut h = header(tar::EntryType::Regular, *mode, data.len() as u64);
                b.append_data(&mut h, p, &data[..]).expect("file entry");
            }
            Entry::Symlink(p, target) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                b.append_link(&mut h, p, target).expect("symlink entry");
            }
            Entry::Whiteout(p) => {
                let path = Path::new(p);
                let name = format!(
                    ".wh.{}",
                    path.file_name().and_then(|n| n.to_str()).expect("name")
                );
                let full = path
                    .parent()
                    .map(|d| d.join(&name))
                    .unwrap_or_else(|| PathBuf::from(&name));
                let mut h = header(tar::EntryType::Regular, 0o600, 0);
                b.append_data(&mut h, full, &[][..])
                    .expect("whiteout entry");
            }
            Entry::Hardlink(p, target) => {
                let mut h = header(tar::EntryType::Link, 0o644, 0);
                let gnu = h.as_gnu_mut().expect("gnu header");
                gnu.name[..p.len()].copy_from_slice(p.as_bytes());
                gnu.linkname[..target.len()].copy_from_slice(target.as_bytes());
                h.set_cksum();
                b.append(&h, &[][..]).expect("hardlink entry");
            }
            Entry::Opaque(dir) => {
                let mut h = header(tar::EntryType::Regular, 0o600, 0);
                b.append_data(&mut h, Path::new(dir).join(".wh..wh..opq"), &[][..])
                    .expect("opaque entry");
            }
        }
    }
    layer_from_tar(b.into_inner().expect("tar"), compress)
}

/// A layer of a tar made elsewhere (GNU tar, Python's tarfile), compressed as asked.
pub fn layer_from_tar(tar: Vec<u8>, compress: Compress) -> TestLayer {
    let diff_id = sha256(&tar);
    let (blob, media_type) = match compress {
        Compress::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), GzLevel::fast());
            e.write_all(&tar).expect("gzip");
            (
                e.finish().expect("gzip"),
                "application/vnd.oci.image.layer.v1.tar+gzip",
            )
        }
        Compress::Zstd => (
            zstd::encode_all(&tar[..], 1).expect("zstd"),
            "application/vnd.oci.image.layer.v1.tar+zstd",
        ),
        Compress::None => (tar, "application/vnd.oci.image.layer.v1.tar"),
    };
    TestLayer {
        digest: sha256(&blob),
        blob,
        diff_id,
        media_type: media_type.to_string(),
    }
}

/// A busybox-static rootfs: /bin/busybox plus a symlink per applet, /etc/passwd and /etc/group.
pub fn busybox_layer(compress: Compress) -> TestLayer {
    layer(&busybox_entries(), compress)
}

/// The entries of `busybox_layer`.
pub fn busybox_entries() -> Vec<Entry> {
    let bin = std::fs::read("/bin/busybox")
        .expect("/bin/busybox missing: run hack/install-test-deps.sh (busybox-static)");
    let out = Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .expect("busybox --list");
    let mut entries = vec![
        Entry::Dir("bin".into()),
        Entry::Dir("etc".into()),
        Entry::Dir("tmp".into()),
        Entry::Dir("root".into()),
        Entry::Dir("home".into()),
        Entry::Dir("home/app".into()),
        Entry::File("bin/busybox".into(), bin, 0o755),
        Entry::File(
            "etc/passwd".into(),
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n".to_vec(),
            0o644,
        ),
        Entry::File("etc/group".into(), b"root:x:0:\napp:x:1000:\nextra:x:2000:app\nnogroup:x:65534:\n".to_vec(), 0o644),
    ];
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        let applet = applet.trim();
        if !applet.is_empty() && applet != "busybox" {
            entries.push(Entry::Symlink(format!("bin/{applet}"), "busybox".into()));
        }
    }
    entries
}

/// A built image: layers, config and manifest bytes.
#[derive(Clone)]
pub struct TestImage {
    pub layers: Vec<TestLayer>,
    pub config: Vec<u8>,
    pub config_digest: String,
    pub manifest: Vec<u8>,
    pub manifest_type: String,
    pub manifest_digest: String,
}

pub struct ImageOpts<'a> {
    pub arch: &'a str,
    pub docker_format: bool,
    pub cmd: &'a [&'a str],
    pub entrypoint: &'a [&'a str],
    pub env: &'a [&'a str],
    pub user: &'a str,
    pub workdir: &'a str,
    pub stop_signal: &'a str,
}

impl Default for ImageOpts<'_> {
    fn default() -> Self {
        ImageOpts {
            arch: "amd64",
            docker_format: false,
            cmd: &["sh"],
            entrypoint: &[],
            env: &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            user: "",
            workdir: "",
            stop_signal: "",
        }
    }
}

pub fn image(layers: Vec<TestLayer>, opts: &ImageOpts) -> TestImage {
    let mut run = serde_json::json!({ "Cmd": opts.cmd, "Env": opts.env });
    if !opts.entrypoint.is_empty() {
        run["Entrypoint"] = serde_json::json!(opts.entrypoint);
    }
    if !opts.user.is_empty() {
        run["User"] = serde_json::json!(opts.user);
    }
    if !opts.workdir.is_empty() {
        run["WorkingDir"] = serde_json::json!(opts.workdir);
    }
    if !opts.stop_signal.is_empty() {
        run["StopSignal"] = serde_json::json!(opts.stop_signal);
    }
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": opts.arch,
        "os": "linux",
        "created": "2024-01-01T00:00:00Z",
        "config": run,
        "rootfs": { "type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>() },
    }))
    .expect("config json");
    let (mt, ct, lt) = if opts.docker_format {
        (
            DOCKER_MANIFEST,
            DOCKER_CONFIG,
            Some("application/vnd.docker.image.rootfs.diff.tar.gzip"),
        )
    } else {
        (OCI_MANIFEST, OCI_CONFIG, None)
    };
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": mt,
        "config": { "mediaType": ct, "digest": sha256(&config), "size": config.len() },
        "layers": layers.iter().map(|l| serde_json::json!({
            "mediaType": lt.unwrap_or(&l.media_type), "digest": l.digest, "size": l.blob.len()
        })).collect::<Vec<_>>(),
    }))
    .expect("manifest json");
    TestImage {
        config_digest: sha256(&config),
        manifest_digest: sha256(&manifest),
        manifest_type: mt.to_string(),
        layers,
        config,
        manifest,
    }
}

/// Busybox and a second layer of one file, `blob.bin`: `len` bytes of `wire::noise(len, seed)`.
/// The image and that layer, for the tests of one large layer's download.
pub fn busybox_and_blob(len: usize, seed: u64, compress: Compress) -> (TestImage, TestLayer) {
    let blob = layer(
        &[Entry::File(
            "blob.bin".into(),
            wire::noise(len, seed),
            0o644,
        )],
        compress,
    );
    let img = image(
        vec![busybox_layer(Compress::Gzip), blob.clone()],
        &ImageOpts::default(),
    );
    (img, blob)
}

/// An index over images of several platforms.
pub fn index(images: &[(&TestImage, &str)]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": images.iter().map(|(img, arch)| serde_json::json!({
            "mediaType": img.manifest_type, "digest": img.manifest_digest, "size": img.manifest.len(),
            "platform": { "architecture": arch, "os": "linux" }
        })).collect::<Vec<_>>(),
    }))
    .expect("index json")
}

thread_local! {
    /// The message and place of this thread's last panic (tests run side by side, each on
    /// its own thread).
    static LAST_FAILURE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Keeps each panic's message (still printed where it happens), so a daemon dropped while
/// its thread unwinds can repeat it after its log.
fn remember_failures() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let upstream = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let place = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let message = format!("{}{place}", info.payload_as_str().unwrap_or("panic"));
            LAST_FAILURE.with(|last| *last.borrow_mut() = Some(message));
            upstream(info);
        }));
    });
}

fn last_failure() -> Option<String> {
    LAST_FAILURE.with(|last| last.borrow().clone())
}

/// A crius daemon with private root, state and socket.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    /// The daemon's own cgroup parent: daemons of tests running side by side must not see
    /// each other's pods as orphans.
    pub cgroup_parent: String,
    pub root: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    /// Extra environment for the daemon's next spawn (the chaos test's `CRIUS_FAULT`).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Starts a daemon; `tables` is extra config after the `[registry]` table (more tables only).
    pub fn start(tables: &str) -> Daemon {
        require_root();
        remember_failures();
        let dir = tempfile::Builder::new()
            .prefix("crius-test")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        let socket = dir.path().join("crius.sock");
        let cfg = dir.path().join("config.toml");
        let certs = dir.path().join("certs.d");
        std::fs::create_dir_all(&certs).expect("certs dir");
        // Runtime state on a tmpfs, as /run is on a node.
        std::fs::create_dir_all(&state).expect("state dir");
        nix::mount::mount(
            Some("tmpfs"),
            &state,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=512m"),
        )
        .expect("tmpfs for the state dir");
        // Tests never read the host's registry settings or credentials.
        let cgroup_parent = format!(
            "crius-test-{}",
            dir.path()
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("x")
                .trim_start_matches("crius-test")
        );
        // A network directory of the test's own (empty unless the test writes a list), never
        // the host's.
        let net_d = dir.path().join("net.d");
        std::fs::create_dir_all(&net_d).expect("net.d");
        // Top-level keys (before the first table) go before [registry].
        let (top, tables) = match tables.find('[') {
            Some(i) if i > 0 => tables.split_at(i),
            None if !tables.trim().is_empty() => (tables, ""),
            _ => ("", tables),
        };
        let tables = if tables.contains("[network]") {
            tables.replace("{NET_D}", &net_d.display().to_string())
        } else {
            format!("{tables}\n[network]\nconf_dir = \"{}\"\n", net_d.display())
        };
        let tables = if tables.contains("[cgroup]") {
            tables.replace(
                "[cgroup]\n",
                &format!("[cgroup]\nparent = \"{cgroup_parent}\"\n"),
            )
        } else {
            format!("{tables}\n[cgroup]\nparent = \"{cgroup_parent}\"\n")
        };
        // NRI on the test's own socket and (empty) plugin directories, never the host's.
        let tables = if tables.contains("[nri]") {
            tables.replace("{NRI_DIR}", &dir.path().join("nri").display().to_string())
        } else {
            format!(
                "{tables}\n[nri]\nsocket_path = \"{0}/nri.sock\"\nplugin_path = \"{0}/plugins\"\nplugin_config_path = \"{0}/conf.d\"\n",
                dir.path().join("nri").display()
            )
        };
        let full = format!(
            "{top}\n[registry]\nconfig_path = \"{}\"\nauth_file = \"{}\"\n{tables}",
            certs.display(),
            dir.path().join("auth.json").display()
        );
        std::fs::write(&cfg, full).expect("write config");
        let mut d = Daemon {
            cgroup_parent,
            log: dir.path().join("daemon.log"),
            root,
            state,
            socket,
            config: cfg,
            dir,
            env: Vec::new(),
            child: None,
        };
        d.spawn();
        d
    }

    /// The socket NRI plugins connect to (in the test's own directory).
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.path().join("nri/nri.sock")
    }

    /// The daemon's CNI configuration directory (empty until a test writes a list).
    pub fn net_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    pub fn certs_dir(&self) -> PathBuf {
        self.dir.path().join("certs.d")
    }

    pub fn auth_file(&self) -> PathBuf {
        self.dir.path().join("auth.json")
    }

    pub fn spawn(&mut self) {
        // None of this test's daemons runs now: a listener still at the path is a killed
        // daemon's, alive in a helper it was starting (until the helper's exec ends), and must
        // not be taken for the new daemon's.
        let _ = std::fs::remove_file(&self.socket);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("daemon log");
        // CRIUS_TEST_BIN runs the tests against another build (a release binary, say).
        let bin = std::env::var("CRIUS_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_crius").to_string());
        let child = Command::new(bin)
            .arg("daemon")
            .arg("--config")
            .arg(&self.config)
            .arg("--root")
            .arg(&self.root)
            .arg("--state")
            .arg(&self.state)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--log-level")
            .arg(std::env::var("CRIUS_TEST_LOG").unwrap_or_else(|_| "info,crius=debug".into()))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start crius daemon");
        self.child = Some(child);
        let socket = self.socket.clone();
        let res = wait_for("the daemon socket", Duration::from_secs(30), || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        });
        if res.is_err() {
            panic!("daemon did not start; log:\n{}", self.log_text());
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A line of the test's own in the daemon's log, to read it by.
    pub fn note(&self, line: &str) {
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.log) {
            let _ = writeln!(f, "---- test: {line}");
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the daemon has ended (reaped when it has).
    pub fn ended(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// SIGKILL, as a crash would.
    /// Restarts the daemon with its root on a tmpfs of `size` (`"1g"`, say): a file system of
    /// its own, whose writes wait on no other process's (and can be filled). The daemon's end
    /// unmounts it with the rest of its directory.
    pub fn restart_on_tmpfs_root(&mut self, size: &str) {
        self.kill9();
        nix::mount::mount(
            Some("tmpfs"),
            &self.root,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .expect("tmpfs for the daemon's root");
        self.spawn();
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let start = Instant::now();
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if start.elapsed() > Duration::from_secs(30) {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn channel(&self) -> Channel {
        crius::cri::client::channel(&self.socket).expect("channel")
    }

    pub fn images(&self) -> crius::cri::v1::image_service_client::ImageServiceClient<Channel> {
        crius::cri::client::images(self.channel())
    }

    pub fn runtime(&self) -> crius::cri::v1::runtime_service_client::RuntimeServiceClient<Channel> {
        crius::cri::client::runtime(self.channel())
    }

    /// The runtime's own verbose info of a pod sandbox (`info["info"]`, parsed).
    pub async fn pod_info(&self, pod: &str) -> serde_json::Value {
        let st = self
            .runtime()
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: pod.into(),
                verbose: true,
            })
            .await
            .expect("pod sandbox status")
            .into_inner();
        serde_json::from_str(&st.info["info"]).expect("verbose info is JSON")
    }

    /// The runtime's own verbose info of a container (`info["info"]`, parsed).
    pub async fn container_info(&self, id: &str) -> serde_json::Value {
        let st = self
            .runtime()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            })
            .await
            .expect("container status")
            .into_inner();
        serde_json::from_str(&st.info["info"]).expect("verbose info is JSON")
    }

    /// Runs the crius CLI against this daemon.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_crius"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run crius cli")
    }

    pub async fn pull(&self, image: &str) -> Result<String, tonic::Status> {
        self.pull_with(image, None).await
    }

    pub async fn pull_with(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
    ) -> Result<String, tonic::Status> {
        self.images()
            .pull_image(cri::PullImageRequest {
                image: Some(spec(image)),
                auth,
                sandbox_config: None,
            })
            .await
            .map(|r| r.into_inner().image_ref)
    }

    pub async fn image_status(&self, image: &str) -> Option<cri::Image> {
        self.images()
            .image_status(cri::ImageStatusRequest {
                image: Some(spec(image)),
                verbose: false,
            })
            .await
            .expect("image status")
            .into_inner()
            .image
    }

    pub async fn list_images(&self) -> Vec<cri::Image> {
        self.images()
            .list_images(cri::ListImagesRequest { filter: None })
            .await
            .expect("list images")
            .into_inner()
            .images
    }

    pub async fn remove_image(&self, image: &str) -> Result<(), tonic::Status> {
        self.images()
            .remove_image(cri::RemoveImageRequest {
                image: Some(spec(image)),
            })
            .await
            .map(|_| ())
    }

    /// Files in the content store's blob directory.
    pub fn blobs(&self) -> Vec<String> {
        list_names(&self.root.join("content/blobs/sha256"))
    }

    pub fn ingests(&self) -> Vec<String> {
        list_names(&self.root.join("content/ingest"))
    }

    /// A file as a committed layer holds it unpacked (layers are not kept as blobs).
    pub fn unpacked_file(&self, path: &str) -> Option<Vec<u8>> {
        self.snapshots().iter().find_map(|s| {
            std::fs::read(self.root.join("snapshots").join(s).join("fs").join(path)).ok()
        })
    }

    pub fn snapshots(&self) -> Vec<String> {
        list_names(&self.root.join("snapshots"))
            .into_iter()
            .filter(|n| n != "ingest")
            .collect()
    }
}

pub fn list_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.log_text());
            // CI shows an output's tail: say again what failed, after the log.
            if let Some(failure) = last_failure() {
                eprintln!("---- end of daemon log; the test failed with ----\n{failure}");
            }
        }
        self.kill_leftovers();
        self.kill_strays();
    }
}

impl Daemon {
    /// Kills whatever pods a failed test left running and unmounts what the daemon mounted, so
    /// one failure does not leak into later tests.
    pub fn kill_leftovers(&self) {
        let ids = |dir: &str, keys: &[&str]| -> Vec<crius::runtime::ProcessId> {
            let mut out = Vec::new();
            for name in list_names(&self.state.join(dir)) {
                let path = self.state.join(dir).join(name).join("state.json");
                let Ok(data) = std::fs::read(&path) else {
                    continue;
                };
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&data) else {
                    continue;
                };
                for k in keys {
                    if let Ok(p) =
                        serde_json::from_value::<crius::runtime::ProcessId>(v[*k].clone())
                    {
                        out.push(p);
                    }
                }
            }
            out
        };
        for p in ids("containers", &["init", "monitor"])
            .into_iter()
            .chain(ids("sandboxes", &["pause"]))
        {
            let _ = p.signal(libc::SIGKILL);
        }
        unmount_under(&[&self.state, &self.root]);
        self.remove_devices_cgroups();
    }

    /// On a cgroup v1 host: the devices cgroups of containers the test left (a daemon killed or
    /// stopped with containers still there, which live on without it as they should), with
    /// whatever runs in them, and the daemon's own parent.
    fn remove_devices_cgroups(&self) {
        let parent = Path::new("/sys/fs/cgroup/devices").join(&self.cgroup_parent);
        for name in list_names(&parent) {
            let dir = parent.join(&name);
            if dir.is_dir() {
                let _ = crius::runtime::devices::remove_v1(&dir);
            }
        }
        let _ = std::fs::remove_dir(&parent);
    }

    /// After the daemon and `kill_leftovers`: any process still naming this daemon's directory
    /// in its command line (a monitor no record owns, or a child of one not yet exec'd) is
    /// killed and told on stderr and in `strays.log` under the target's temp dir (on the host;
    /// the VM sees the tree read-only), which `cargo xtask ci` prints after the host tier: the
    /// test passed, but what it left says where the runtime let go of a process.
    pub fn kill_strays(&self) {
        let dir = self.dir.path().display().to_string();
        let scan = || {
            let mut out = Vec::new();
            for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                if cmd.contains(&dir) {
                    out.push((pid, cmd.trim().to_string()));
                }
            }
            out
        };
        // What `kill_leftovers` signalled may take a moment to go.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut found = scan();
        while !found.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            found = scan();
        }
        if found.is_empty() {
            return;
        }
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let mut report = String::new();
        for (pid, cmd) in &found {
            let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}"));
            let state = read("stat")
                .ok()
                .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()?.to_string()))
                .unwrap_or_default();
            let wchan = read("wchan").unwrap_or_default();
            let ppid = read("status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("PPid:").map(|v| v.trim().to_string()))
                })
                .unwrap_or_default();
            report.push_str(&format!(
                "{test}: pid {pid} (parent {ppid}, state {state}, in {wchan}): {cmd}\n"
            ));
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        eprint!("stray processes killed:\n{report}");
        let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("strays.log");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = f.write_all(report.as_bytes());
        }
    }

    /// The daemon's per-RPC durations from its debug log, in milliseconds.
    pub fn rpc_times(&self, rpc: &str) -> Vec<f64> {
        let needle = format!("rpc=\"{rpc}\"");
        self.log_text()
            .lines()
            .filter(|l| l.contains(&needle) && l.contains("rpc ok"))
            .filter_map(|l| {
                let e = l.split("elapsed=").nth(1)?.split_whitespace().next()?;
                match (e.strip_suffix("ms"), e.strip_suffix("µs")) {
                    (Some(v), _) => v.parse().ok(),
                    (_, Some(v)) => v.parse::<f64>().ok().map(|x| x / 1000.0),
                    _ => None,
                }
            })
            .collect()
    }
}

/// Unmounts everything mounted at or below `dirs`, deepest first.
pub fn unmount_under(dirs: &[&Path]) {
    let prefixes: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| prefixes.iter().any(|p| m.starts_with(p.as_str())))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A pod config's namespace modes (kubelet always sends them), to change one.
pub fn namespace_options(cfg: &mut cri::PodSandboxConfig) -> &mut cri::NamespaceOption {
    cfg.linux
        .get_or_insert_default()
        .security_context
        .get_or_insert_default()
        .namespace_options
        .get_or_insert_default()
}

pub fn spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}

/// This test process's registry, with busybox pushed as `busybox:test`: pod tests share it,
/// since a registry's start, busybox's layer and its push took 1.8 s a test under the VM tier's
/// emulated CPU. Tests push other images under their own names. It lives until the process
/// ends; then its keeper stops it and removes its storage.
pub async fn shared_registry() -> &'static Registry {
    static SHARED: tokio::sync::OnceCell<Registry> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            let reg = Registry::launch(Auth::None, false, true);
            let img = image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default());
            reg.push_image("busybox", "test", &img)
                .await
                .expect("push busybox");
            reg
        })
        .await
}

/// A daemon with busybox pulled from this process's registry: the starting point of pod tests.
pub struct PodEnv {
    pub reg: &'static Registry,
    pub d: Daemon,
    pub image: String,
    pub logs: tempfile::TempDir,
}

impl PodEnv {
    pub async fn start() -> PodEnv {
        Self::start_with("").await
    }

    pub async fn start_with(tables: &str) -> PodEnv {
        let reg = shared_registry().await;
        let d = Daemon::start(tables);
        let image = format!("{}/busybox:test", reg.host());
        d.pull(&image).await.expect("pull busybox");
        PodEnv {
            reg,
            d,
            image,
            logs: tempfile::tempdir().expect("log dir"),
        }
    }

    pub fn sandbox_config(&self, name: &str) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self.logs.path().join(name).display().to_string(),
            labels: [("app".to_string(), name.to_string())].into(),
            // As kubelet sends it: namespace modes are always explicit (the zero value is POD).
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(container_pid()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn container_config(&self, name: &str, cmd: &[&str]) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(spec(&self.image)),
            command: cmd.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(container_pid()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The pod's pause process (its host pid), from the verbose sandbox status.
    pub async fn pause_pid(&self, pod: &str) -> i64 {
        self.d.pod_info(pod).await["pid"].as_i64().expect("pid")
    }

    pub async fn run_pod(&self, cfg: &cri::PodSandboxConfig) -> Result<String, tonic::Status> {
        std::fs::create_dir_all(&cfg.log_directory).expect("log directory");
        self.d
            .runtime()
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg.clone()),
                runtime_handler: String::new(),
            })
            .await
            .map(|r| r.into_inner().pod_sandbox_id)
    }

    pub async fn create(
        &self,
        pod: &str,
        sb: &cri::PodSandboxConfig,
        cfg: cri::ContainerConfig,
    ) -> Result<String, tonic::Status> {
        self.d
            .runtime()
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(cfg),
                sandbox_config: Some(sb.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), tonic::Status> {
        self.d
            .runtime()
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .map(|_| ())
    }

    /// Creates and starts a container; returns its ID.
    pub async fn run(
        &self,
        pod: &str,
        sb: &cri::PodSandboxConfig,
        cfg: cri::ContainerConfig,
    ) -> String {
        let id = self.create(pod, sb, cfg).await.expect("create container");
        self.start_container(&id).await.expect("start container");
        id
    }

    pub async fn status(&self, id: &str) -> cri::ContainerStatus {
        self.d
            .runtime()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .expect("container status")
            .into_inner()
            .status
            .expect("status")
    }

    pub async fn exec(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> Result<(String, String, i32), tonic::Status> {
        self.d
            .runtime()
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await
            .map(|r| {
                let r = r.into_inner();
                (
                    String::from_utf8_lossy(&r.stdout).into_owned(),
                    String::from_utf8_lossy(&r.stderr).into_owned(),
                    r.exit_code,
                )
            })
    }

    /// Waits until a container has exited; returns its status.
    pub async fn wait_exit(&self, id: &str, timeout: Duration) -> cri::ContainerStatus {
        let start = Instant::now();
        loop {
            let s = self.status(id).await;
            if s.state == cri::ContainerState::ContainerExited as i32 {
                return s;
            }
            assert!(
                start.elapsed() < timeout,
                "container {id} did not exit in {timeout:?}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log(&self, sb: &cri::PodSandboxConfig, name: &str) -> String {
        std::fs::read_to_string(Path::new(&sb.log_directory).join(format!("{name}.log")))
            .unwrap_or_default()
    }

    pub async fn stop_pod(&self, id: &str) {
        self.d
            .runtime()
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .expect("stop pod");
    }

    pub async fn remove_pod(&self, id: &str) {
        self.d
            .runtime()
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .expect("remove pod");
    }
}

/// Namespace options as kubelet sends them for an ordinary pod: pod network and IPC, a PID
/// namespace per container.
pub fn container_pid() -> cri::NamespaceOption {
    cri::NamespaceOption {
        pid: cri::NamespaceMode::Container as i32,
        ..Default::default()
    }
}

/// Contents of log lines (the part after `<time> <stream> <tag> `), per stream.
pub fn log_lines(log: &str, stream: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            let mut p = l.splitn(4, ' ');
            let _ts = p.next()?;
            let s = p.next()?;
            let _tag = p.next()?;
            (s == stream).then(|| p.next().unwrap_or("").to_string())
        })
        .collect()
}

/// A token realm for the registry's token auth: it answers `GET /token` with a JWT signed (RS256)
/// by a key whose certificate the registry trusts, for the one user it knows.
pub struct TokenIssuer {
    pub port: u16,
    pub cert: PathBuf,
    key: PathBuf,
    der: Vec<u8>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// How many tokens were handed out through the realm.
    pub issued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// While above zero, requests are answered 503 with `Retry-After: 1` (and it counts down).
    pub busy: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn b64url(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

/// Signs a JWT for `sub` with `actions` on repository `name` (`*` for any).
fn sign_token(key: &Path, der: &[u8], sub: &str, name: &str, actions: &[&str]) -> String {
    use base64::Engine;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "x5c": [base64::engine::general_purpose::STANDARD.encode(der)]});
    let claims = serde_json::json!({
        "iss": "crius-test", "sub": sub, "aud": "crius-registry",
        "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}-{}", rand_u64()),
        "access": [{"type": "repository", "name": name, "actions": actions}],
    });
    let signing = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign", &key.display().to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(signing.as_bytes())
        .expect("sign");
    let sig = child.wait_with_output().expect("openssl").stdout;
    format!("{signing}.{}", b64url(&sig))
}

impl TokenIssuer {
    fn start(dir: &Path, user: &str, pass: &str) -> TokenIssuer {
        let cert = dir.join("token.crt");
        let key = dir.join("token.key");
        let (c, k) = (cert.display().to_string(), key.display().to_string());
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=crius token issuer",
            "-keyout",
            &k,
            "-out",
            &c,
        ]);
        let der = Command::new("openssl")
            .args(["x509", "-in", &c, "-outform", "DER"])
            .output()
            .expect("openssl")
            .stdout;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let issued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let expected = {
            use base64::Engine;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
            )
        };
        let busy = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop2, issued2, key2, der2) = (stop.clone(), issued.clone(), key.clone(), der.clone());
        let busy2 = busy.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let mut buf = vec![0u8; 16 << 10];
                let n = std::io::Read::read(&mut conn, &mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let line = req.lines().next().unwrap_or("").to_string();
                let authorized = req.lines().any(|l| {
                    l.to_ascii_lowercase().starts_with("authorization:")
                        && l[14..].trim() == expected
                });
                let query = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|p| p.split_once('?'))
                    .map(|(_, q)| q.to_string())
                    .unwrap_or_default();
                let scope = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("scope="))
                    .map(|s| {
                        s.replace("%3A", ":")
                            .replace("%2F", "/")
                            .replace("%2C", ",")
                    })
                    .unwrap_or_default();
                let was_busy = busy2
                    .fetch_update(
                        std::sync::atomic::Ordering::SeqCst,
                        std::sync::atomic::Ordering::SeqCst,
                        |b| b.checked_sub(1),
                    )
                    .is_ok();
                if was_busy {
                    let _ = std::io::Write::write_all(
                        &mut conn,
                        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                let (status, body) = if authorized {
                    // scope = repository:NAME:ACTIONS; readers get pull only
                    let name = scope.split(':').nth(1).unwrap_or("").to_string();
                    issued2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let token = sign_token(&key2, &der2, "reader", &name, &["pull"]);
                    (
                        "200 OK",
                        serde_json::json!({"token": token, "expires_in": 300}).to_string(),
                    )
                } else {
                    (
                        "401 Unauthorized",
                        "{\"details\":\"bad credentials\"}".to_string(),
                    )
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = std::io::Write::write_all(&mut conn, resp.as_bytes());
            }
        });
        TokenIssuer {
            port,
            cert,
            key,
            der,
            stop,
            issued,
            busy,
        }
    }

    /// A token straight from the issuer (for the test's own pushes).
    pub fn issue(&self, sub: &str, name: &str, actions: &[&str]) -> String {
        sign_token(&self.key, &self.der, sub, name, actions)
    }
}

impl Drop for TokenIssuer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("random");
    u64::from_le_bytes(b)
}

/// Serves gRPC health inside a pod's network namespace on `addr`:`port`: the listening socket
/// is made by a thread that entered the namespace; the server runs here.
pub async fn grpc_health_in(
    netns: &str,
    addr: &str,
    port: u16,
) -> tonic_health::server::HealthReporter {
    let (ns, addr) = (netns.to_string(), addr.to_string());
    let listener = std::thread::spawn(move || {
        let f = std::fs::File::open(&ns).expect("pod netns");
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let l = std::net::TcpListener::bind((addr.as_str(), port)).expect("bind in the pod");
        l.set_nonblocking(true).expect("nonblocking");
        l
    })
    .join()
    .expect("netns thread");
    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
    let (reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    reporter
}

/// Port forwarding over kubelet's WebSocket channels with `protocol` (none when empty): sends
/// `request` on port 0's data channel and collects every (channel, payload) until the server
/// closes.
pub async fn channel_forward(url: &str, protocol: &str, request: &[u8]) -> Vec<(u8, Vec<u8>)> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    // kubelet's server is https (a certificate of its own, not verified here); crius's
    // streaming server is http unless asked otherwise.
    let (tls, rest) = match url.strip_prefix("https://") {
        Some(rest) => (true, rest),
        None => (
            false,
            url.strip_prefix("http://").expect("channel port forward"),
        ),
    };
    let ws_url = format!("{}{rest}", if tls { "wss://" } else { "ws://" });
    let mut req = ws_url
        .as_str()
        .into_client_request()
        .expect("channel port forward");
    if !protocol.is_empty() {
        req.headers_mut().insert(
            "sec-websocket-protocol",
            protocol.parse().expect("channel port forward"),
        );
    }
    let addr = rest.split('/').next().expect("channel port forward");
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("channel port forward");
    if tls {
        let config = crius::tls::unverified_client().expect("a TLS client");
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string();
        let name = rustls::pki_types::ServerName::try_from(host).expect("a server name");
        let stream = connector
            .connect(name, tcp)
            .await
            .expect("channel port forward: TLS");
        channel_session(req, stream, protocol, request).await
    } else {
        channel_session(req, tcp, protocol, request).await
    }
}

/// One WebSocket port-forward session over `stream`: `request` on the data channel, then
/// every frame until the server closes.
async fn channel_session<S>(
    req: tokio_tungstenite::tungstenite::handshake::client::Request,
    stream: S,
    protocol: &str,
    request: &[u8],
) -> Vec<(u8, Vec<u8>)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use base64::Engine;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut ws, _) = tokio_tungstenite::client_async(req, stream)
        .await
        .expect("channel port forward");
    let b64 = protocol.contains("base64");
    let first = if b64 {
        let text = format!(
            "0{}",
            base64::engine::general_purpose::STANDARD.encode(request)
        );
        Message::text(text)
    } else {
        Message::binary([&[0u8][..], request].concat())
    };
    ws.send(first).await.expect("channel port forward");
    let mut got = Vec::new();
    let collect = async {
        while let Some(Ok(m)) = ws.next().await {
            match m {
                Message::Binary(b) if !b.is_empty() => got.push((b[0], b[1..].to_vec())),
                Message::Text(t) if b64 => {
                    let ch = t.as_bytes()[0] - b'0';
                    let data = base64::engine::general_purpose::STANDARD
                        .decode(&t.as_str()[1..])
                        .expect("channel port forward");
                    got.push((ch, data));
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), collect)
        .await
        .expect("the port forward ended");
    got
}

/// A process's resident memory, in KiB.
pub fn rss_kib(pid: u32) -> i64 {
    status_kib(pid, "VmRSS")
}

/// A figure in KiB of a process's `/proc/PID/status` (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, key: &str) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("process status")
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
}
