//! ImageService through the CRI socket against a real registry.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use common::wire::*;
use common::*;
use crius::cri::v1 as cri;
use tonic::Code;

fn busybox_image(compress: Compress) -> TestImage {
    image(vec![busybox_layer(compress)], &ImageOpts::default())
}

#[tokio::test]
async fn pull_by_tag_and_by_digest() {
    let reg = Registry::start(None);
    let img = busybox_image(Compress::Gzip);
    let manifest = reg.push_image("busybox", "1.0", &img).await.unwrap();
    let d = Daemon::start("");

    let name = format!("{}/busybox:1.0", reg.host());
    let id = d.pull(&name).await.unwrap();
    assert_eq!(
        id, img.config_digest,
        "PullImage returns the config digest as image ref"
    );

    let st = d.image_status(&name).await.expect("image is known by tag");
    assert_eq!(st.id, img.config_digest);
    assert_eq!(st.repo_tags, vec![name.clone()]);
    assert_eq!(
        st.repo_digests,
        vec![format!("{}/busybox@{manifest}", reg.host())]
    );
    assert_eq!(
        st.size,
        (img.config.len() + img.layers[0].blob.len()) as u64
    );
    // also known by ID and by repo digest
    assert!(d.image_status(&img.config_digest).await.is_some());
    assert!(
        d.image_status(&format!("{}/busybox@{manifest}", reg.host()))
            .await
            .is_some()
    );
    assert!(
        d.image_status(&format!("{}/busybox:2.0", reg.host()))
            .await
            .is_none()
    );

    // the unpacked snapshot holds the rootfs
    let snaps = d.snapshots();
    assert_eq!(snaps.len(), 1);
    let fs = d.root.join("snapshots").join(&snaps[0]).join("fs");
    assert!(fs.join("bin/busybox").is_file());
    assert_eq!(
        std::fs::read_link(fs.join("bin/sh")).unwrap().to_str(),
        Some("busybox")
    );

    // by digest: same image, no tag added
    let by_digest = format!("{}/busybox@{manifest}", reg.host());
    assert_eq!(d.pull(&by_digest).await.unwrap(), img.config_digest);
    // name:tag@digest pulls by digest
    let both = format!("{}/busybox:ignored@{manifest}", reg.host());
    assert_eq!(d.pull(&both).await.unwrap(), img.config_digest);
    let list = d.list_images().await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].repo_tags[0], name);

    // the same registry by name: localhost is loopback too (plain HTTP, resolved by the resolver)
    let by_name = format!("localhost:{}/busybox:1.0", reg.port);
    assert_eq!(d.pull(&by_name).await.unwrap(), img.config_digest);
    assert!(d.image_status(&by_name).await.is_some());

    // a digest the registry does not have
    let missing = format!("{}/busybox@{}", reg.host(), sha256(b"nothing"));
    assert_eq!(d.pull(&missing).await.unwrap_err().code(), Code::NotFound);

    // verbose status carries the config
    let verbose = d
        .images()
        .image_status(cri::ImageStatusRequest {
            image: Some(spec(&name)),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).unwrap();
    assert_eq!(info["imageSpec"]["architecture"], "amd64");

    // image filesystem usage counts the unpacked layer
    let fs_info = d
        .images()
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let usage = &fs_info.image_filesystems[0];
    assert!(usage.used_bytes.as_ref().unwrap().value > 1_000_000);
    assert!(usage.inodes_used.as_ref().unwrap().value > 100);
    assert!(
        usage
            .fs_id
            .as_ref()
            .unwrap()
            .mountpoint
            .ends_with("snapshots")
    );
}

#[tokio::test]
async fn zstd_plain_layers_and_whiteouts() {
    let reg = Registry::start(None);
    let base = busybox_layer(Compress::Zstd);
    let add = layer(
        &[
            Entry::Dir("data".into()),
            Entry::File("data/keep".into(), b"keep".to_vec(), 0o644),
            Entry::File("data/gone".into(), b"gone".to_vec(), 0o644),
            Entry::Dir("cache".into()),
            Entry::File("cache/old".into(), b"old".to_vec(), 0o644),
        ],
        Compress::None,
    );
    let remove = layer(
        &[
            Entry::Whiteout("data/gone".into()),
            Entry::Opaque("cache".into()),
            Entry::File("cache/new".into(), b"new".to_vec(), 0o600),
        ],
        Compress::Gzip,
    );
    let img = image(vec![base, add, remove], &ImageOpts::default());
    reg.push_image("layered", "v1", &img).await.unwrap();
    let d = Daemon::start("");
    d.pull(&format!("{}/layered:v1", reg.host())).await.unwrap();
    assert_eq!(d.snapshots().len(), 3);
    // the top layer's snapshot has an overlay whiteout and an opaque directory
    let chain_top = {
        let st = d
            .images()
            .image_status(cri::ImageStatusRequest {
                image: Some(spec(&img.config_digest)),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
        info["chainID"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:")
            .to_string()
    };
    let top = d.root.join("snapshots").join(chain_top).join("fs");
    let wh = std::fs::symlink_metadata(top.join("data/gone")).unwrap();
    assert!(
        wh.file_type().is_char_device(),
        "whiteout is a character device"
    );
    let cache = std::fs::File::open(top.join("cache")).unwrap();
    assert_eq!(
        crius::sys::fgetxattr(&cache, b"trusted.overlay.opaque").unwrap(),
        Some(b"y".to_vec())
    );

    // mounted as overlayfs, the stack shows the right view
    let lowers = crius_lowers(&d, &img);
    let mnt = tempfile::tempdir().unwrap();
    let opts = format!("lowerdir={}", lowers.join(":"));
    nix::mount::mount(
        Some("overlay"),
        mnt.path(),
        Some("overlay"),
        nix::mount::MsFlags::MS_RDONLY,
        Some(opts.as_str()),
    )
    .unwrap();
    let view = |p: &str| mnt.path().join(p);
    let seen = (
        view("data/keep").exists(),
        view("data/gone").exists(),
        view("cache/old").exists(),
        view("cache/new").exists(),
        view("bin/busybox").exists(),
    );
    nix::mount::umount(mnt.path()).unwrap();
    assert_eq!(seen, (true, false, false, true, true));
}

/// Layers as some builders write them: names with a leading `/`, and hardlinks to files an
/// earlier layer holds (copied up, since overlay layers cannot share an inode); containerd 1.6
/// refuses the second kind. A link to a file a layer in between deleted is still refused.
#[tokio::test]
async fn absolute_names_and_links_to_lower_layers() {
    let reg = Registry::start(None);
    let base = busybox_layer(Compress::Gzip);
    let tools = layer(
        &[
            Entry::Dir("opt".into()),
            Entry::File("opt/tool".into(), b"tool v1".to_vec(), 0o755),
            Entry::File("opt/gone".into(), b"x".to_vec(), 0o644),
        ],
        Compress::Gzip,
    );
    let links = layer(
        &[
            Entry::Hardlink("/opt/tool-alias".into(), "/opt/tool".into()),
            Entry::Hardlink("usr/local/bin/tool".into(), "opt/tool".into()),
            Entry::Hardlink("/bin/sh-again".into(), "bin/busybox".into()),
        ],
        Compress::Gzip,
    );
    let img = image(
        vec![base.clone(), tools.clone(), links],
        &ImageOpts::default(),
    );
    reg.push_image("links", "v1", &img).await.unwrap();
    let d = Daemon::start("");
    d.pull(&format!("{}/links:v1", reg.host())).await.unwrap();
    let top = std::path::PathBuf::from(&crius_lowers(&d, &img)[0]);
    for alias in ["opt/tool-alias", "usr/local/bin/tool"] {
        assert_eq!(
            std::fs::read(top.join(alias)).unwrap(),
            b"tool v1",
            "{alias}"
        );
        let mode = std::fs::metadata(top.join(alias)).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
            0o755
        );
    }
    assert_eq!(
        std::fs::read(top.join("bin/sh-again")).unwrap(),
        std::fs::read("/bin/busybox").unwrap()
    );

    // Deleted in between: the pull fails naming the entry, and commits nothing of that layer.
    let gone = layer(&[Entry::Whiteout("opt/gone".into())], Compress::Gzip);
    let dangling = layer(
        &[Entry::Hardlink("opt/again".into(), "opt/gone".into())],
        Compress::Gzip,
    );
    let bad = image(vec![base, tools, gone, dangling], &ImageOpts::default());
    reg.push_image("links", "bad", &bad).await.unwrap();
    let before = d.snapshots().len();
    let err = d
        .pull(&format!("{}/links:bad", reg.host()))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("opt/again") && err.message().contains("deleted"),
        "{err:?}"
    );
    assert_eq!(
        d.snapshots().len(),
        before + 1,
        "only the whiteout layer lands"
    );
}

/// Lower directories of an image's rootfs, topmost first, from the snapshot records.
fn crius_lowers(d: &Daemon, img: &TestImage) -> Vec<String> {
    let diff_ids: Vec<String> = img.layers.iter().map(|l| l.diff_id.clone()).collect();
    let mut chains: Vec<String> = Vec::new();
    for diff in &diff_ids {
        let next = match chains.last() {
            None => diff.clone(),
            Some(p) => sha256(format!("{p} {diff}").as_bytes()),
        };
        chains.push(next);
    }
    chains
        .iter()
        .rev()
        .map(|c| {
            d.root
                .join("snapshots")
                .join(c.trim_start_matches("sha256:"))
                .join("fs")
                .display()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn multi_platform_index_and_docker_manifests() {
    let reg = Registry::start(None);
    let amd = image(
        vec![busybox_layer(Compress::Gzip)],
        &ImageOpts {
            docker_format: true,
            ..Default::default()
        },
    );
    let arm_layer = layer(
        &[Entry::File("arch".into(), b"arm64".to_vec(), 0o644)],
        Compress::Gzip,
    );
    let arm = image(
        vec![arm_layer],
        &ImageOpts {
            arch: "arm64",
            ..Default::default()
        },
    );
    for img in [&amd, &arm] {
        for l in &img.layers {
            reg.push_blob("multi", &l.blob).await.unwrap();
        }
        reg.push_blob("multi", &img.config).await.unwrap();
        reg.push_manifest(
            "multi",
            &img.manifest_digest,
            &img.manifest_type,
            &img.manifest,
        )
        .await
        .unwrap();
    }
    let idx = index(&[(&arm, "arm64"), (&amd, "amd64")]);
    let idx_digest = reg
        .push_manifest("multi", "latest", OCI_INDEX, &idx)
        .await
        .unwrap();
    let only_arm = index(&[(&arm, "arm64")]);
    reg.push_manifest("multi", "armonly", OCI_INDEX, &only_arm)
        .await
        .unwrap();

    let d = Daemon::start("");
    let id = d.pull(&format!("{}/multi", reg.host())).await.unwrap();
    assert_eq!(
        id, amd.config_digest,
        "the node's platform (linux/amd64) is picked from the index"
    );
    let st = d.image_status(&id).await.unwrap();
    assert_eq!(
        st.repo_digests,
        vec![format!("{}/multi@{idx_digest}", reg.host())],
        "repo digest is the index digest"
    );
    // the docker-format manifest verified like any other
    assert!(
        d.blobs().contains(
            &amd.manifest_digest
                .trim_start_matches("sha256:")
                .to_string()
        )
    );

    let err = d
        .pull(&format!("{}/multi:armonly", reg.host()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("linux/amd64") && err.message().contains("linux/arm64"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn basic_auth_registry() {
    let reg = Registry::start(Some(("alice", "wonderland")));
    let img = busybox_image(Compress::Gzip);
    reg.push_image("private/app", "1", &img).await.unwrap();
    let mut d = Daemon::start("");
    let name = format!("{}/private/app:1", reg.host());

    let err = d.pull(&name).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let wrong = cri::AuthConfig {
        username: "alice".into(),
        password: "nope".into(),
        ..Default::default()
    };
    let err = d.pull_with(&name, Some(wrong)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("rejected"), "{}", err.message());
    assert!(d.list_images().await.is_empty());

    let right = cri::AuthConfig {
        username: "alice".into(),
        password: "wonderland".into(),
        ..Default::default()
    };
    assert_eq!(
        d.pull_with(&name, Some(right)).await.unwrap(),
        img.config_digest
    );

    // the base64 `auth` field works too
    d.remove_image(&name).await.unwrap();
    let b64 = cri::AuthConfig {
        auth: base64::engine::general_purpose::STANDARD.encode("alice:wonderland"),
        ..Default::default()
    };
    assert_eq!(
        d.pull_with(&name, Some(b64)).await.unwrap(),
        img.config_digest
    );

    // credentials from the docker config file when the request has none
    d.remove_image(&name).await.unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode("alice:wonderland");
    std::fs::write(
        d.auth_file(),
        format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, reg.host()),
    )
    .unwrap();
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);

    // a credential helper the config names for the registry, found in the daemon's PATH
    d.remove_image(&name).await.unwrap();
    let helpers = tempfile::tempdir().unwrap();
    let script = helpers.path().join("docker-credential-test");
    std::fs::write(
        &script,
        "#!/bin/sh\n[ \"$1\" = get ] || exit 3\nread -r server\n\
         printf '{\"ServerURL\":\"%s\",\"Username\":\"alice\",\"Secret\":\"wonderland\"}' \"$server\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        d.auth_file(),
        format!(r#"{{"credHelpers":{{"{}":"test"}}}}"#, reg.host()),
    )
    .unwrap();
    d.kill9();
    let path = std::env::var("PATH").unwrap_or_default();
    d.env.push((
        "PATH".into(),
        format!("{}:{path}", helpers.path().display()),
    ));
    d.spawn();
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);

    // the CLI's --creds
    d.remove_image(&name).await.unwrap();
    std::fs::remove_file(d.auth_file()).unwrap();
    let out = d.cli(&["pull", "--quiet", "--creds", "alice:wonderland", &name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = d.cli(&["pull", "--quiet", "--creds", "alice:bad", &name]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("authentication failed"));
}

#[tokio::test]
async fn corrupted_blob_is_rejected_and_nothing_is_committed() {
    let reg = Registry::start(None);
    let img = busybox_image(Compress::Gzip);
    reg.push_image("corrupt", "1", &img).await.unwrap();
    // flip bytes in the middle of the layer in the registry's storage
    let file = reg.blob_file(&img.layers[0].digest);
    let mut data = std::fs::read(&file).unwrap();
    let mid = data.len() / 2;
    for b in &mut data[mid..mid + 64] {
        *b ^= 0xff;
    }
    std::fs::write(&file, &data).unwrap();

    let d = Daemon::start("");
    let err = d
        .pull(&format!("{}/corrupt:1", reg.host()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    assert!(
        err.message().contains(&img.layers[0].digest),
        "{}",
        err.message()
    );
    let layer_hex = img.layers[0]
        .digest
        .trim_start_matches("sha256:")
        .to_string();
    assert!(
        !d.blobs().contains(&layer_hex),
        "the corrupt layer was not committed"
    );
    assert!(d.snapshots().is_empty(), "no snapshot from a corrupt layer");
    assert!(
        d.ingests().is_empty(),
        "no ingest file remains for bytes proven wrong"
    );
    assert!(d.list_images().await.is_empty());

    // a corrupt config is rejected too
    let reg2 = Registry::start(None);
    let img2 = busybox_image(Compress::Zstd);
    reg2.push_image("corrupt", "2", &img2).await.unwrap();
    let cfile = reg2.blob_file(&img2.config_digest);
    let mut c = std::fs::read(&cfile).unwrap();
    c[10] ^= 1;
    std::fs::write(&cfile, c).unwrap();
    let err = d
        .pull(&format!("{}/corrupt:2", reg2.host()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    assert!(err.message().contains("config"), "{}", err.message());
}

#[tokio::test]
async fn hostile_layer_fails_the_pull_cleanly() {
    let reg = Registry::start(None);
    // a layer whose symlink points out and then writes through it
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    b.append_link(&mut h, "escape", "/tmp").unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(4);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    // the tar crate refuses to write such names itself: write the name field by hand
    h.as_gnu_mut().unwrap().name[..16].copy_from_slice(b"escape/pwned-by-");
    h.set_cksum();
    b.append(&h, &b"evil"[..]).unwrap();
    let tar = b.into_inner().unwrap();
    let hostile = TestLayer {
        digest: sha256(&tar),
        diff_id: sha256(&tar),
        blob: tar,
        media_type: "application/vnd.oci.image.layer.v1.tar".into(),
    };
    let img = image(vec![hostile], &ImageOpts::default());
    reg.push_image("hostile", "1", &img).await.unwrap();
    let d = Daemon::start("");
    let err = d
        .pull(&format!("{}/hostile:1", reg.host()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("symlink"), "{}", err.message());
    assert!(!std::path::Path::new("/tmp/pwned-by-").exists());
    assert!(d.snapshots().is_empty());
    assert!(d.ingests().is_empty());
    assert!(
        !d.blobs().contains(
            &img.layers[0]
                .digest
                .trim_start_matches("sha256:")
                .to_string()
        )
    );
}

#[tokio::test]
async fn images_survive_restart_and_removal_collects_garbage() {
    let reg = Registry::start(None);
    let base = busybox_layer(Compress::Gzip);
    let extra = layer(
        &[Entry::File("extra".into(), b"x".to_vec(), 0o644)],
        Compress::Gzip,
    );
    let a = image(vec![base.clone()], &ImageOpts::default());
    let b = image(
        vec![base, extra],
        &ImageOpts {
            cmd: &["true"],
            ..Default::default()
        },
    );
    reg.push_image("a", "1", &a).await.unwrap();
    reg.push_image("b", "1", &b).await.unwrap();
    let mut d = Daemon::start("");
    let (na, nb) = (format!("{}/a:1", reg.host()), format!("{}/b:1", reg.host()));
    d.pull(&na).await.unwrap();
    d.pull(&nb).await.unwrap();
    // a second tag of the same image
    reg.push_image("a", "2", &a).await.unwrap();
    d.pull(&format!("{}/a:2", reg.host())).await.unwrap();
    assert_eq!(d.image_status(&na).await.unwrap().repo_tags.len(), 2);
    assert_eq!(
        d.snapshots().len(),
        2,
        "the shared base layer is unpacked once"
    );

    d.restart();
    let list = d.list_images().await;
    assert_eq!(list.len(), 2, "image records survive a restart");
    assert_eq!(d.image_status(&na).await.unwrap().repo_tags.len(), 2);

    // Kill -9 too: records are on disk before PullImage answers.
    d.kill9();
    d.spawn();
    assert_eq!(d.list_images().await.len(), 2);

    // removing b frees its own layer but keeps the shared base
    d.remove_image(&nb).await.unwrap();
    assert_eq!(d.snapshots().len(), 1);
    assert!(
        !d.blobs()
            .contains(&b.config_digest.trim_start_matches("sha256:").to_string())
    );
    assert!(
        d.blobs()
            .contains(&a.config_digest.trim_start_matches("sha256:").to_string())
    );
    // removing by one tag removes the image with all its tags
    d.remove_image(&format!("{}/a:2", reg.host()))
        .await
        .unwrap();
    assert!(d.image_status(&na).await.is_none());
    assert!(d.snapshots().is_empty());
    assert!(d.blobs().is_empty());
    // idempotent
    d.remove_image(&na).await.unwrap();
    d.remove_image(&a.config_digest).await.unwrap();
}

#[tokio::test]
async fn invalid_references_are_rejected() {
    let d = Daemon::start("");
    for (bad, want) in [
        ("UPPER/case", "lowercase"),
        ("busybox:-x", "tag"),
        ("busybox@sha256:12", "digest"),
        ("", "required"),
    ] {
        let err = d.pull(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad}: {err:?}");
        assert!(err.message().contains(want), "{bad}: {}", err.message());
    }
    let long_tag = format!("busybox:{}", "a".repeat(129));
    let err = d.pull(&long_tag).await.unwrap_err();
    assert!(err.message().contains("128"), "{}", err.message());
}

#[tokio::test]
async fn mirrors_from_hosts_toml() {
    let mirror = Registry::start(None);
    let img = busybox_image(Compress::Gzip);
    mirror
        .push_image("library/busybox", "latest", &img)
        .await
        .unwrap();
    let d = Daemon::start("");
    // docker.io served by a mirror; the first mirror is down, the second answers
    let dead = free_port();
    let dir = d.certs_dir().join("docker.io");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"https://registry-1.docker.io\"\n\n[host.\"http://127.0.0.1:{dead}\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            mirror.host()
        ),
    )
    .unwrap();
    assert_eq!(d.pull("busybox").await.unwrap(), img.config_digest);
    let st = d
        .image_status("docker.io/library/busybox:latest")
        .await
        .unwrap();
    assert_eq!(
        st.repo_tags,
        vec!["docker.io/library/busybox:latest".to_string()]
    );
    // and by the short name too
    assert!(d.image_status("busybox").await.is_some());
}

#[tokio::test]
async fn concurrent_pulls_share_the_work() {
    let reg = Registry::start(None);
    let img = busybox_image(Compress::Gzip);
    reg.push_image("shared", "1", &img).await.unwrap();
    let d = Daemon::start("");
    let name = format!("{}/shared:1", reg.host());
    let pulls = (0..4).map(|_| d.pull(&name));
    let results = futures_util::future::join_all(pulls).await;
    for r in results {
        assert_eq!(r.unwrap(), img.config_digest);
    }
    assert_eq!(d.snapshots().len(), 1);
    assert!(d.ingests().is_empty());
    let unpacked = d.log_text().matches("resuming").count();
    assert_eq!(unpacked, 0);
    // Shared: each layer was fetched from the registry once, for all four pulls.
    for l in &img.layers {
        let path = format!("/v2/shared/blobs/{}", l.digest);
        assert_eq!(reg.requests("GET", &path), 1, "GET {path}");
    }
}

/// A TCP proxy that forwards registry traffic at a limited rate: the only way to catch a pull
/// in the middle on loopback.
struct SlowProxy {
    port: u16,
    rate: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl SlowProxy {
    fn start(target: u16, bytes_per_sec: u64) -> SlowProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let rate = Arc::new(AtomicU64::new(bytes_per_sec));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (rate.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pipe(c2, s2, None));
                let r = r.clone();
                std::thread::spawn(move || pipe(server, client, Some(r)));
            }
        });
        SlowProxy { port, rate, stop }
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

#[tokio::test]
async fn killed_mid_pull_resumes_after_restart() {
    let reg = Registry::start(None);
    let (img, big) = busybox_and_blob(24 << 20, 7, Compress::Gzip);
    reg.push_image("big", "1", &img).await.unwrap();
    let proxy = SlowProxy::start(reg.port, 3 << 20);
    let mut d = Daemon::start("");
    let name = format!("127.0.0.1:{}/big:1", proxy.port);

    let pull = {
        let mut images = d.images();
        let name = name.clone();
        tokio::spawn(async move {
            images
                .pull_image(cri::PullImageRequest {
                    image: Some(spec(&name)),
                    ..Default::default()
                })
                .await
        })
    };
    // wait until a good part of the big layer is on disk, then crash the daemon
    let big_hex = big.digest.trim_start_matches("sha256:").to_string();
    let ingest = d.root.join("content/ingest").join(&big_hex);
    let start = Instant::now();
    while std::fs::metadata(&ingest).map(|m| m.len()).unwrap_or(0) < (4 << 20) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "download did not progress"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.kill9();
    assert!(pull.await.unwrap().is_err(), "the interrupted pull fails");
    let partial = std::fs::metadata(&ingest).unwrap().len();
    assert!(partial > 0 && (partial as usize) < big.blob.len());
    assert!(
        !d.blobs().contains(&big_hex),
        "a partial download is never a blob"
    );

    proxy.rate.store(0, Ordering::Relaxed); // full speed now
    d.spawn();
    assert!(
        d.list_images().await.is_empty(),
        "nothing recorded from the interrupted pull"
    );
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);
    assert!(
        d.log_text().contains("resuming layer download"),
        "the second pull resumed the partial download"
    );
    assert!(d.ingests().is_empty());
    assert!(
        !d.blobs().contains(&big_hex),
        "the layer is kept unpacked only"
    );
    assert_eq!(d.unpacked_file("blob.bin"), Some(noise(24 << 20, 7)));
    assert_eq!(d.snapshots().len(), 2);
    assert!(
        d.root
            .join("snapshots/ingest")
            .read_dir()
            .unwrap()
            .next()
            .is_none(),
        "no half-unpacked layer remains"
    );
}

#[tokio::test]
async fn cli_pull_images_inspect_rmi() {
    let reg = Registry::start(None);
    let img = busybox_image(Compress::Gzip);
    reg.push_image("cli", "v1", &img).await.unwrap();
    let d = Daemon::start("");
    let name = format!("{}/cli:v1", reg.host());
    let out = d.cli(&["pull", &name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&img.config_digest));

    let out = d.cli(&["images"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("IMAGE"), "{text}");
    assert!(
        text.contains(&format!("{}/cli", reg.host())) && text.contains("v1"),
        "{text}"
    );

    let out = d.cli(&["images", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["images"][0]["id"], img.config_digest.as_str());

    let out = d.cli(&["inspecti", &name]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["info"]["imageSpec"]["os"], "linux");

    let out = d.cli(&["version"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("RuntimeName: crius"));

    let out = d.cli(&["rmi", &name]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Deleted: sha256:"));
    let out = d.cli(&["rmi", &name]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such image"));

    // a bad reference is named in the error
    let out = d.cli(&["pull", "Bad/Name"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("lowercase"));
}

#[tokio::test]
async fn bearer_token_registry() {
    let reg = Registry::start_with(Auth::Token("tok", "en"), false);
    let img = busybox_image(Compress::Gzip);
    reg.push_image("private/tokened", "1", &img).await.unwrap();
    let d = Daemon::start("");
    let name = format!("{}/private/tokened:1", reg.host());
    let err = d.pull(&name).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(
        err.message().contains("token request answered 401"),
        "{}",
        err.message()
    );
    let wrong = cri::AuthConfig {
        username: "tok".into(),
        password: "wrong".into(),
        ..Default::default()
    };
    assert_eq!(
        d.pull_with(&name, Some(wrong)).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let right = cri::AuthConfig {
        username: "tok".into(),
        password: "en".into(),
        ..Default::default()
    };
    assert_eq!(
        d.pull_with(&name, Some(right.clone())).await.unwrap(),
        img.config_digest
    );
    let issued = reg
        .token
        .as_ref()
        .unwrap()
        .issued
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(issued >= 1);
    // a second pull reuses the cached token
    d.remove_image(&name).await.unwrap();
    assert_eq!(
        d.pull_with(&name, Some(right)).await.unwrap(),
        img.config_digest
    );
    let after = reg
        .token
        .as_ref()
        .unwrap()
        .issued
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(after, issued, "the token is reused until it expires");
    // A busy token server is waited for as a busy registry is.
    let fresh = Daemon::start("");
    let token = reg.token.as_ref().unwrap();
    token.busy.store(2, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        fresh.pull_with(&name, Some(right_again())).await.unwrap(),
        img.config_digest
    );
    assert_eq!(token.busy.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(fresh.log_text().contains("token server busy; retrying"));
}

fn right_again() -> cri::AuthConfig {
    cri::AuthConfig {
        username: "tok".into(),
        password: "en".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn tls_registry_with_ca_or_skip_verify() {
    let reg = Registry::start_with(Auth::None, true);
    let img = busybox_image(Compress::Gzip);
    reg.push_image("secure", "1", &img).await.unwrap();
    let name = format!("{}/secure:1", reg.host());
    let with_certs = |files: &[(&str, Vec<u8>)]| {
        let d = Daemon::start("");
        let dir = d.certs_dir().join(reg.host());
        std::fs::create_dir_all(&dir).unwrap();
        for (n, data) in files {
            std::fs::write(dir.join(n), data).unwrap();
        }
        d
    };
    let ca = std::fs::read(reg.ca.as_ref().unwrap()).unwrap();
    // an unknown CA is refused (and plain HTTP to a TLS port fails too)
    let d = with_certs(&[]);
    let err = d.pull(&name).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // the CA named in hosts.toml
    let hosts = format!(
        "server = \"https://{h}\"\n[host.\"https://{h}\"]\n  ca = \"registry-ca.crt\"\n",
        h = reg.host()
    );
    let d = with_certs(&[
        ("registry-ca.crt", ca.clone()),
        ("hosts.toml", hosts.into_bytes()),
    ]);
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);
    // no verification at all, when the operator says so
    let hosts = format!("server = \"https://{}\"\nskip_verify = true\n", reg.host());
    let d = with_certs(&[("hosts.toml", hosts.into_bytes())]);
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);
    // docker-style certs.d: a CA file and no hosts.toml
    let d = with_certs(&[("ca.crt", ca)]);
    assert_eq!(d.pull(&name).await.unwrap(), img.config_digest);
}

/// `img` again with `labels` in its config and `annotations` on its manifest and on each of
/// its layers.
fn with_labels(
    img: &TestImage,
    labels: &std::collections::BTreeMap<String, String>,
    annotations: &std::collections::BTreeMap<String, String>,
) -> TestImage {
    let mut config: serde_json::Value = serde_json::from_slice(&img.config).unwrap();
    config["config"]["Labels"] = serde_json::json!(labels);
    let config = serde_json::to_vec(&config).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
    manifest["config"]["digest"] = serde_json::json!(sha256(&config));
    manifest["config"]["size"] = serde_json::json!(config.len());
    manifest["annotations"] = serde_json::json!(annotations);
    for l in manifest["layers"].as_array_mut().unwrap() {
        l["annotations"] = serde_json::json!(annotations);
    }
    let manifest = serde_json::to_vec(&manifest).unwrap();
    TestImage {
        layers: img.layers.clone(),
        config_digest: sha256(&config),
        config,
        manifest_digest: sha256(&manifest),
        manifest,
        manifest_type: img.manifest_type.clone(),
    }
}

/// CVE-2026-53488: labels and annotations are data, never commands. An image whose config
/// labels and whose manifest and layer annotations hold shell (`$(touch M)`, backquotes, `;`,
/// `|`, `&&`, a newline), pulled and run in a pod and a container whose labels and
/// annotations hold the same: no marker is made, on the host or in the container, and every
/// string comes back byte for byte (the image's in ImageStatus's verbose info, the pod's and
/// the container's in their statuses).
#[tokio::test]
async fn labels_and_annotations_are_never_run() {
    let env = PodEnv::start().await;
    // A path that a shell could make both on the host and in the container (whose /tmp is the
    // image's).
    let marker = |i: usize| PathBuf::from(format!("/tmp/crius-label-{}-{i}", std::process::id()));
    let shells = [
        "$(touch {m})",
        "`touch {m}`",
        "x; touch {m}",
        "x | touch {m}",
        "x && touch {m}",
        "x\ntouch {m}\n",
        "';touch {m};'",
    ];
    let hostile: std::collections::BTreeMap<String, String> = shells
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let m = marker(i).display().to_string();
            (format!("x.example/{i}"), s.replace("{m}", &m))
        })
        .collect();
    let img = with_labels(
        &image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default()),
        &hostile,
        &hostile,
    );
    env.reg.push_image("labelled", "1", &img).await.unwrap();
    let name = format!("{}/labelled:1", env.reg.host());
    assert_eq!(env.d.pull(&name).await.unwrap(), img.config_digest);
    let st = env
        .d
        .images()
        .image_status(cri::ImageStatusRequest {
            image: Some(spec(&name)),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
    let labels: std::collections::BTreeMap<String, String> =
        serde_json::from_value(info["imageSpec"]["config"]["Labels"].clone()).unwrap();
    assert_eq!(labels, hostile, "the image's labels, verbatim");

    let hostile: std::collections::HashMap<String, String> = hostile.into_iter().collect();
    let mut sb = env.sandbox_config("labelled");
    sb.labels.extend(hostile.clone());
    sb.annotations = hostile.clone();
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("c", &["sleep", "100000"]);
    cfg.image = Some(spec(&name));
    cfg.labels = hostile.clone();
    cfg.annotations = hostile.clone();
    let c = env.run(&pod, &sb, cfg).await;
    let cs = env.status(&c).await;
    assert_eq!(cs.labels, hostile, "the container's labels, verbatim");
    assert_eq!(
        cs.annotations, hostile,
        "the container's annotations, verbatim"
    );
    let ps = env
        .d
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(ps.annotations, hostile, "the pod's annotations, verbatim");
    assert!(hostile.iter().all(|(k, v)| ps.labels.get(k) == Some(v)));
    // A label selector holding shell matches the container, and runs nothing either.
    let (k, v) = hostile.iter().next().unwrap();
    let listed = env
        .d
        .runtime()
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [(k.clone(), v.clone())].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 1);

    let markers: Vec<String> = (0..shells.len())
        .map(|i| marker(i).display().to_string())
        .collect();
    let (out, err, code) = env
        .exec(
            &c,
            &[
                "sh",
                "-c",
                &format!("ls {} 2>/dev/null; true", markers.join(" ")),
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(
        (out.as_str(), code),
        ("", 0),
        "made in the container: {err}"
    );
    env.remove_pod(&pod).await;
    let made: Vec<&String> = markers.iter().filter(|m| Path::new(m).exists()).collect();
    for m in &made {
        let _ = std::fs::remove_file(m);
    }
    assert!(made.is_empty(), "made on the host: {made:?}");
}
