//! The node e2e suite's images, built here from Debian's busybox (critest's base image) and
//! programs of the suite's own release, pushed to the test registry under the repository paths
//! `KUBE_TEST_REPO_LIST` maps the suite's registries to. Each has what the suite's specs use:
//! agnhost is the suite's `agnhost` binary (its entry point, `pause` by default) with the user
//! and group the image defines and the tools of upstream's image that Debian has; busybox is
//! busybox (its `sh` passing env names like `data-1` on); glibc-dns-testing has glibc's `hostname`; nginx serves :80 (critest's web server);
//! nonroot runs as 1234; nonewprivs has a setuid-root entry point; pause sleeps until a signal.

use std::path::Path;

use super::images::*;
use crate::common::*;

/// Programs of upstream's agnhost image beside its binary, where this machine has them (with
/// their libraries): `curl`, `bash`, `socat` and OpenBSD's `nc` (the networking specs dial UDP
/// with `nc -u`, which busybox's lacks); busybox's applets give the rest (`nslookup`, `ip`,
/// `wget`).
const AGNHOST_TOOLS: [(&str, &str); 4] = [
    ("/usr/bin/curl", "usr/bin/curl"),
    ("/usr/bin/bash", "bin/bash"),
    ("/usr/bin/socat", "usr/bin/socat"),
    ("/usr/bin/nc.openbsd", "usr/bin/nc"),
];

const SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");

/// A host program and its libraries, as layer entries at `at` (relative).
fn host_program(host: &str, at: &str) -> Vec<Entry> {
    let mut files = vec![(at.to_string(), std::fs::read(host).expect("program"), 0o755)];
    for (path, lib) in shared_libraries(host) {
        files.push((path, std::fs::read(&lib).expect("library"), 0o755));
    }
    let mut dirs: Vec<String> = files.iter().flat_map(|(p, ..)| parents(p)).collect();
    dirs.sort();
    dirs.dedup();
    let mut entries: Vec<Entry> = dirs.into_iter().map(Entry::Dir).collect();
    entries.extend(files.into_iter().map(|(p, d, m)| Entry::File(p, d, m)));
    entries
}

/// agnhost's layer: the binary at `/agnhost` (and `/agnhost-2`, the name some specs run),
/// `/uploads` and `/localhost.crt` and `.key` for netexec, the image's user 1000 and group
/// 50000, and the tools present here.
fn agnhost_layer(part: &Path) -> TestLayer {
    let read = |name: &str| {
        std::fs::read(part.join(name)).unwrap_or_else(|e| {
            panic!("{name} of the node-e2e part: {e} (hack/install-upstream.sh node-e2e)")
        })
    };
    let mut entries = vec![
        Entry::Dir("etc".into()),
        Entry::File("agnhost".into(), read("agnhost"), 0o755),
        // netexec's https certificate and key, at the paths the specs give it.
        Entry::File("localhost.crt".into(), read("localhost.crt"), 0o644),
        Entry::File("localhost.key".into(), read("localhost.key"), 0o644),
        Entry::Symlink("agnhost-2".into(), "agnhost".into()),
        Entry::DirMode("uploads".into(), 0o777),
        Entry::File(
            "etc/passwd".into(),
            format!("{PASSWD}user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")
                .into_bytes(),
            0o644,
        ),
        Entry::File(
            "etc/group".into(),
            format!(
                "{GROUP}user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
            )
            .into_bytes(),
            0o644,
        ),
    ];
    for (host, at) in AGNHOST_TOOLS {
        if Path::new(host).exists() {
            entries.extend(host_program(host, at));
        }
    }
    // Directories once, before what is in them.
    let mut seen = std::collections::HashSet::new();
    entries.retain(|e| match e {
        Entry::Dir(d) => seen.insert(d.clone()),
        _ => true,
    });
    entries.sort_by_key(|e| !matches!(e, Entry::Dir(_) | Entry::DirMode(..)));
    layer(&entries, Compress::Gzip)
}

/// Every image the suite's specs pull, under the names the suite gives them (below the
/// registries of `repo_list`): the agnhost version is the suite's own (`agnhost.version` of the
/// node-e2e part).
pub fn build(work: &Path, part: &Path) -> Vec<Pushed> {
    let agnhost_version = std::fs::read_to_string(part.join("agnhost.version"))
        .expect("agnhost.version of the node-e2e part")
        .trim()
        .to_string();
    let base = busybox_base();
    // busybox's nmeter, which Debian's busybox lacks (the lifecycle specs read the time with it).
    let nmeter = compile_source(work, &Path::new(SOURCES).join("node_e2e/nmeter.c"));
    // `sh`: busybox's ash, but `sh -c WORD` runs WORD with the whole environment, as
    // upstream's 1.37 ash passes on names like `data-1` (the env-from specs' keys), which
    // Debian's 1.35 drops (node_e2e/sh.c).
    let sh = compile_source(work, &Path::new(SOURCES).join("node_e2e/sh.c"));
    let tools = files_layer(&[("bin/sh", sh, 0o755), ("usr/bin/nmeter", nmeter, 0o755)]);
    // One image per name, each with a layer naming it: names that shared a digest would share
    // one image, whose status names only one of them (a pod updated from one tag to another,
    // as the lifecycle specs do, would never show the new one).
    let on_base = |extra: Option<TestLayer>, o: &ImageOpts, names: Vec<String>| -> Vec<Pushed> {
        names
            .into_iter()
            .map(|name| {
                let mut layers = vec![base.clone(), tools.clone()];
                layers.extend(extra.clone());
                layers.push(files_layer(&[(
                    "etc/e2e-image",
                    format!("{name}\n").into_bytes(),
                    0o644,
                )]));
                Pushed {
                    image: image(layers, o),
                    names: vec![name],
                }
            })
            .collect()
    };
    let webserver = compile_source(work, &Path::new(SOURCES).join("conformance/webserver.c"));
    let nonewprivs = compile_source(work, &Path::new(SOURCES).join("conformance/nonewprivs.c"));
    let pause = compile_source(work, &Path::new(SOURCES).join("node_e2e/pause.c"));
    let e2e = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .map(|n| format!("e2e-test-images/{n}"))
            .collect()
    };
    let mut out = Vec::new();
    out.extend(on_base(
        Some(agnhost_layer(part)),
        &ImageOpts {
            entrypoint: &["/agnhost"],
            cmd: &["pause"],
            ..Default::default()
        },
        e2e(&[
            &format!("agnhost:{agnhost_version}"),
            // AgnhostPrev, which the suite's older specs name.
            "agnhost:2.55",
        ]),
    ));
    out.extend(on_base(
        None,
        &ImageOpts::default(),
        e2e(&["busybox:1.37.0-2", "busybox:1.36.1-1"]),
    ));
    // glibc's `hostname` (Debian's, with its libraries: `-f` resolves through glibc, the
    // point of upstream's image) ahead of busybox's applet on PATH, hosts from files first.
    let mut glibc = host_program("/usr/bin/hostname", "usr/bin/hostname");
    glibc.push(Entry::File(
        "etc/nsswitch.conf".into(),
        b"hosts: files dns\n".to_vec(),
        0o644,
    ));
    out.extend(on_base(
        Some(layer(&glibc, Compress::Gzip)),
        &ImageOpts::default(),
        e2e(&["glibc-dns-testing:2.1.1"]),
    ));
    out.extend(on_base(
        Some(files_layer(&[("usr/sbin/nginx", webserver, 0o755)])),
        &ImageOpts {
            cmd: &["nginx", "-g", "daemon off;"],
            env: &NGINX_ENV,
            ..Default::default()
        },
        e2e(&["nginx:1.27.0-2", "nginx:1.28.0-2"]),
    ));
    out.extend(on_base(
        None,
        &ImageOpts {
            user: "1234",
            ..Default::default()
        },
        e2e(&["nonroot:1.5"]),
    ));
    out.extend(on_base(
        Some(files_layer(&[("usr/local/bin/nnp", nonewprivs, 0o4755)])),
        &ImageOpts {
            cmd: &["nnp"],
            env: &[PATH_ENV],
            ..Default::default()
        },
        e2e(&["nonewprivs:1.4"]),
    ));
    out.push(Pushed {
        image: image(
            vec![files_layer(&[("pause", pause, 0o755)])],
            &ImageOpts {
                entrypoint: &["/pause"],
                cmd: &[],
                env: &[PATH_ENV],
                ..Default::default()
            },
        ),
        names: vec!["pause:3.10.2".into()],
    });
    out
}

/// `KUBE_TEST_REPO_LIST`: each of the suite's registries below the test registry (the
/// invalid and private ones keep their names, which nothing here resolves: those specs expect
/// the pull to fail).
pub fn repo_list(reg: &Registry) -> String {
    let r = reg.host();
    format!(
        "promoterE2eRegistry: {r}/e2e-test-images\n\
         buildImageRegistry: {r}/build-image\n\
         gcEtcdRegistry: {r}\n\
         gcRegistry: {r}\n\
         sigStorageRegistry: {r}/sig-storage\n\
         dockerLibraryRegistry: {r}/library\n\
         cloudProviderGcpRegistry: {r}/cloud-provider-gcp\n"
    )
}
