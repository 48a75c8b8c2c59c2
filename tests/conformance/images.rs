//! critest's image set, built here and pushed to the test registry under the repository paths
//! critest pulls (`registry.k8s.io/e2e-test-images/...`, `gcr.io/k8s-staging-cri-tools/...`);
//! the daemon reaches them through hosts.toml mirrors. Every image has the content its specs
//! check (see /work/shared/docs/critest.md): busybox with the applets, scripts and users critest
//! runs, web servers that behave like nginx and httpd, a setuid entry point for NoNewPrivs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// Debian's dynamically linked busybox, unpacked by `hack/install-test-deps.sh`: built without
/// `FEATURE_SH_STANDALONE` (unlike busybox-static), so its shell runs commands from PATH as the
/// real busybox image's shell does; the MaskedPaths spec masks `/bin/ls` and expects the shell's
/// exec to fail.
pub const PATH_BUSYBOX: &str = "/opt/crius-test/busybox/bin/busybox";

const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/conformance");

/// critest's registries; the test registry serves each as a mirror (the newer suites pull one
/// image from two of them and expect one image).
pub const REGISTRIES: [&str; 3] = ["registry.k8s.io", "gcr.io", "k8s.gcr.io"];

/// One image and the `repository:tag` names it is pushed under (repository paths without the
/// registry host).
pub struct Pushed {
    pub image: TestImage,
    pub names: Vec<String>,
}

/// The static programs the images carry, compiled with the machine's C compiler.
struct Programs {
    webserver: Vec<u8>,
    nonewprivs: Vec<u8>,
}

fn compile(dir: &Path, name: &str) -> Vec<u8> {
    compile_source(dir, &Path::new(SOURCES).join(format!("{name}.c")))
}

/// A C program of this repository's, compiled static in `dir`; its bytes.
pub fn compile_source(dir: &Path, source: &Path) -> Vec<u8> {
    let name = source.file_stem().expect("a source file's name");
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(["-static", "-Os", "-o"])
        .arg(&out)
        .arg(source)
        .status()
        .expect("cc (gcc and libc6-dev: run hack/install-build-deps.sh)");
    assert!(status.success(), "compiling {} failed", source.display());
    std::fs::read(&out).expect("compiled program")
}

/// Files a dynamically linked binary needs at run time (its loader and libraries), as
/// `(path inside the image, host file)`, from `ldd`.
pub fn shared_libraries(bin: &str) -> Vec<(String, PathBuf)> {
    let out = Command::new("ldd").arg(bin).output().expect("ldd");
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            let real = std::fs::canonicalize(p).expect("library path");
            libs.push((p.trim_start_matches('/').to_string(), real));
        }
    }
    assert!(!libs.is_empty(), "ldd found no libraries for {bin}");
    libs
}

/// Every directory above `path` (relative), outermost first.
pub fn parents(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut acc = String::new();
    let parts: Vec<&str> = path.split('/').collect();
    for p in &parts[..parts.len() - 1] {
        if !acc.is_empty() {
            acc.push('/');
        }
        acc.push_str(p);
        out.push(acc.clone());
    }
    out
}

pub const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
daemon:x:1:1:daemon:/usr/sbin:/bin/false\n\
bin:x:2:2:bin:/bin:/bin/false\n\
sys:x:3:3:sys:/dev:/bin/false\n\
www-data:x:33:33:www-data:/var/www:/bin/false\n\
operator:x:37:37:Operator:/var:/bin/false\n\
nobody:x:65534:65534:nobody:/home:/bin/false\n";

pub const GROUP: &str = "root:x:0:\ndaemon:x:1:\nbin:x:2:\nsys:x:3:\nwww-data:x:33:\n\
operator:x:37:\nusers:x:100:\nnogroup:x:65534:\n";

/// `pgrep NAME`, which busybox lacks here: the pids of processes so named, one a line; exit 1
/// when there are none.
const PGREP: &str = "#!/bin/sh\n\
# pgrep for this image: pids of the processes named $1, one a line; exit 1 when none.\n\
[ $# -eq 1 ] || { echo \"usage: pgrep NAME\" >&2; exit 2; }\n\
pids=$(pidof \"$1\") || exit 1\n\
for p in $pids; do echo \"$p\"; done\n";

/// `ipcs -m`, which busybox lacks here: the System V shared memory segments of the IPC
/// namespace, from /proc/sysvipc/shm. The header holds no digits, so a segment ID is only found
/// where there is a segment.
const IPCS: &str = "#!/bin/sh\n\
# ipcs -m for this image: the shared memory segments of this IPC namespace.\n\
[ \"$1\" = -m ] || { echo \"usage: ipcs -m\" >&2; exit 2; }\n\
echo '------ Shared Memory Segments --------'\n\
echo 'key        shmid      owner      perms      bytes      nattch'\n\
tail -n +2 /proc/sysvipc/shm | while read key id perms size cpid lpid nattch uid rest; do\n\
  printf '0x%08x %-10s %-10s %-10s %-10s %s\\n' \"$key\" \"$id\" \"$uid\" \"$perms\" \"$size\" \"$nattch\"\n\
done\n";

/// The base of every image: busybox with its applets in /bin, its libraries, pgrep and ipcs,
/// the users critest names, and writable /tmp and /var/run.
pub fn busybox_base() -> TestLayer {
    let bin = std::fs::read(PATH_BUSYBOX).unwrap_or_else(|e| {
        panic!("{PATH_BUSYBOX}: {e}: run hack/install-test-deps.sh (Debian's busybox, unpacked)")
    });
    let list = Command::new(PATH_BUSYBOX)
        .arg("--list")
        .output()
        .expect("busybox --list");
    let mut dirs = vec![
        "bin", "etc", "home", "root", "usr", "usr/bin", "usr/sbin", "var", "var/www",
    ];
    let libs = shared_libraries(PATH_BUSYBOX);
    let mut lib_dirs: Vec<String> = libs.iter().flat_map(|(p, _)| parents(p)).collect();
    lib_dirs.sort();
    lib_dirs.dedup();
    dirs.retain(|d| !lib_dirs.iter().any(|l| l == d));
    let mut entries: Vec<Entry> = dirs.iter().map(|d| Entry::Dir(d.to_string())).collect();
    entries.extend(lib_dirs.into_iter().map(Entry::Dir));
    entries.extend([
        Entry::DirMode("tmp".into(), 0o1777),
        Entry::DirMode("var/run".into(), 0o755),
        Entry::File("bin/busybox".into(), bin, 0o755),
        Entry::File("etc/passwd".into(), PASSWD.into(), 0o644),
        Entry::File("etc/group".into(), GROUP.into(), 0o644),
        Entry::File("usr/bin/pgrep".into(), PGREP.into(), 0o755),
        Entry::File("usr/bin/ipcs".into(), IPCS.into(), 0o755),
    ]);
    for (path, host) in libs {
        let data = std::fs::read(&host).expect("library");
        entries.push(Entry::File(path, data, 0o755));
    }
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let applet = applet.trim();
        if !applet.is_empty() && applet != "busybox" {
            // Hard links, as in the real image: a path masked by a bind mount (the MaskedPaths
            // spec masks /bin/ls) must not take the busybox binary with it.
            entries.push(Entry::Hardlink(
                format!("bin/{applet}"),
                "bin/busybox".into(),
            ));
        }
    }
    layer(&entries, Compress::Gzip)
}

/// A layer of a few files (with their parent directories).
pub fn files_layer(files: &[(&str, Vec<u8>, u32)]) -> TestLayer {
    let mut dirs: Vec<String> = files.iter().flat_map(|(p, ..)| parents(p)).collect();
    dirs.sort();
    dirs.dedup();
    let mut entries: Vec<Entry> = dirs.into_iter().map(Entry::Dir).collect();
    for (p, data, mode) in files {
        entries.push(Entry::File(p.to_string(), data.clone(), *mode));
    }
    layer(&entries, Compress::Gzip)
}

pub const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub const NGINX_ENV: [&str; 4] = [
    PATH_ENV,
    "PORT=80",
    "PIDFILE=/var/run/nginx.pid",
    "TITLE=nginx: master process nginx -g daemon off;",
];
/// hostnet-nginx listens on 12003 (critest's `webServerHostNetContainerPort`).
const HOSTNET_NGINX_ENV: [&str; 4] = [
    PATH_ENV,
    "PORT=12003",
    "PIDFILE=/var/run/nginx.pid",
    "TITLE=nginx: master process nginx -g daemon off;",
];

/// Builds every image critest pulls (except the one pinned to an upstream digest).
pub fn build(work: &Path) -> Vec<Pushed> {
    let progs = Programs {
        webserver: compile(work, "webserver"),
        nonewprivs: compile(work, "nonewprivs"),
    };
    let base = busybox_base();
    let opts = |cmd: &'static [&'static str]| ImageOpts {
        cmd,
        env: &[PATH_ENV],
        ..Default::default()
    };
    let on_base = |extra: Option<TestLayer>, o: &ImageOpts| {
        let mut layers = vec![base.clone()];
        layers.extend(extra);
        image(layers, o)
    };
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut out = Vec::new();

    // The default test image.
    out.push(Pushed {
        image: on_base(None, &opts(&["sh"])),
        names: names(&["e2e-test-images/busybox:1.29-2"]),
    });
    // Images that differ by an empty file named after each, as upstream's; one image may carry
    // several tags.
    for (n, tags) in [
        ("test-image-latest", &["latest"][..]),
        ("test-image-tag", &["test", "all"]),
        ("test-image-tags", &["1", "2", "3"]),
        ("test-image-1", &["latest"]),
        ("test-image-2", &["latest"]),
        ("test-image-3", &["latest"]),
    ] {
        let extra = files_layer(&[(n, Vec::new(), 0o644)]);
        out.push(Pushed {
            image: on_base(Some(extra), &opts(&["sh"])),
            names: tags
                .iter()
                .map(|t| format!("k8s-staging-cri-tools/{n}:{t}"))
                .collect(),
        });
    }
    for (n, user) in [
        ("test-image-user-uid", "1002"),
        ("test-image-user-username", "www-data"),
        ("test-image-user-uid-group", "1003:1004"),
        ("test-image-user-username-group", "www-data:1004"),
    ] {
        let o = ImageOpts {
            user,
            ..opts(&["sh"])
        };
        out.push(Pushed {
            image: on_base(None, &o),
            names: vec![format!("k8s-staging-cri-tools/{n}:latest")],
        });
    }
    // uid 1000 belongs to group 50000 through /etc/group only.
    let predefined = files_layer(&[
        (
            "etc/passwd",
            format!("{PASSWD}default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n")
                .into_bytes(),
            0o644,
        ),
        (
            "etc/group",
            format!("{GROUP}default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n")
                .into_bytes(),
            0o644,
        ),
        ("home/default-user/.profile", Vec::new(), 0o644),
    ]);
    let o = ImageOpts {
        user: "1000",
        ..opts(&["sh"])
    };
    out.push(Pushed {
        image: on_base(Some(predefined), &o),
        names: names(&["k8s-staging-cri-tools/test-image-predefined-group:latest"]),
    });

    // nginx: PID 1 titled as nginx's master process, its pid in /var/run/nginx.pid.
    let nginx_layer = files_layer(&[("usr/sbin/nginx", progs.webserver.clone(), 0o755)]);
    let nginx = |env: &'static [&'static str]| ImageOpts {
        cmd: &["nginx", "-g", "daemon off;"],
        env,
        ..Default::default()
    };
    out.push(Pushed {
        image: on_base(Some(nginx_layer.clone()), &nginx(&NGINX_ENV)),
        names: names(&["e2e-test-images/nginx:1.14-2"]),
    });
    out.push(Pushed {
        image: on_base(Some(nginx_layer), &nginx(&HOSTNET_NGINX_ENV)),
        names: names(&["k8s-staging-cri-tools/hostnet-nginx-amd64:latest"]),
    });
    // httpd: serves :80 and logs a line naming itself.
    let httpd_layer = files_layer(&[("usr/local/apache2/bin/httpd", progs.webserver, 0o755)]);
    let o = ImageOpts {
        cmd: &["httpd"],
        env: &[
            "PATH=/usr/local/apache2/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PORT=80",
        ],
        workdir: "/usr/local/apache2",
        ..Default::default()
    };
    out.push(Pushed {
        image: on_base(Some(httpd_layer), &o),
        names: names(&["e2e-test-images/httpd:2.4.39-4"]),
    });
    // nonewprivs: a setuid-root entry point reporting its effective uid.
    let nnp_layer = files_layer(&[("usr/local/bin/nnp", progs.nonewprivs, 0o4755)]);
    let o = ImageOpts {
        cmd: &[],
        entrypoint: &["/usr/local/bin/nnp"],
        env: &[PATH_ENV],
        ..Default::default()
    };
    out.push(Pushed {
        image: on_base(Some(nnp_layer), &o),
        names: names(&["e2e-test-images/nonewprivs:1.3"]),
    });
    // The image the newer suites pull from two registries ("Image Identifier Consistency",
    // tag removal across registries): the same bytes under both.
    out.push(Pushed {
        image: on_base(
            Some(files_layer(&[("pause", Vec::new(), 0o644)])),
            &opts(&["sleep", "100000"]),
        ),
        names: names(&["pause:3.9"]),
    });
    out
}

/// Pushes the images under all their names, once for all of critest's suites.
pub async fn publish(reg: &Registry, images: &[Pushed]) {
    for p in images {
        for name in &p.names {
            let (repo, tag) = name.rsplit_once(':').expect("repo:tag");
            reg.push_image(repo, tag, &p.image)
                .await
                .unwrap_or_else(|e| panic!("pushing {name}: {e:#}"));
        }
    }
}

/// Points the daemon's hosts.toml for critest's registries at the test registry, as mirror and
/// as server: a name the registry lacks (the digest spec's) fails there instead of falling back
/// to the real host, so nothing leaves this machine.
pub fn point_at(reg: &Registry, d: &Daemon) {
    for host in REGISTRIES {
        let dir = d.certs_dir().join(host);
        std::fs::create_dir_all(&dir).expect("hosts.toml directory");
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{r}\"\n\n[host.\"http://{r}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                r = reg.host()
            ),
        )
        .expect("hosts.toml");
    }
}
