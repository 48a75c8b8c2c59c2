//! Lazy pulling (`image.lazy_pull`) of eStargz images from a real registry: a container runs
//! before the layers are pulled, reading its files through the `lazyfs` helpers; a chunk whose
//! bytes do not match the TOC is an I/O error, never wrong data; a daemon restart keeps a
//! running container's files; the whole pull behind takes over, and nothing is left.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::estargz::{self, TOC_DIGEST_ANNOTATION};
use common::*;
use crius::cri::v1 as cri;

/// An eStargz layer as pushed, with its TOC (read back and checked by `estargz::verify`).
#[derive(Clone)]
struct LazyLayer {
    layer: TestLayer,
    toc_digest: String,
    toc: serde_json::Value,
}

/// An eStargz layer of `entries`, in chunks of 1 MiB.
fn lazy_layer(entries: &[Entry]) -> LazyLayer {
    let tar = layer(entries, Compress::None).blob;
    let e = estargz::convert(&tar, 1 << 20).unwrap();
    let toc = estargz::verify(&e, &tar).unwrap();
    LazyLayer {
        layer: TestLayer {
            digest: sha256(&e.blob),
            blob: e.blob,
            diff_id: e.diff_id,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
        },
        toc_digest: e.toc_digest,
        toc,
    }
}

/// The image with each layer's TOC digest annotated, as eStargz tools push it.
fn annotated(layers: Vec<LazyLayer>) -> TestImage {
    let tocs: Vec<String> = layers.iter().map(|l| l.toc_digest.clone()).collect();
    let mut img = image(
        layers.into_iter().map(|l| l.layer).collect(),
        &ImageOpts::default(),
    );
    let mut m: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
    for (l, toc) in m["layers"].as_array_mut().unwrap().iter_mut().zip(&tocs) {
        l["annotations"] = serde_json::json!({ TOC_DIGEST_ANNOTATION: toc });
    }
    img.manifest = serde_json::to_vec(&m).unwrap();
    img.manifest_digest = sha256(&img.manifest);
    img
}

/// Where a file's first chunk starts in the blob.
fn chunk_offset(l: &LazyLayer, name: &str) -> usize {
    let e = l.toc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap();
    e["offset"].as_u64().unwrap() as usize
}

fn lazy_dirs(d: &Daemon) -> Vec<String> {
    list_names(&d.root.join("lazy"))
}

fn lazy_mounts(d: &Daemon) -> usize {
    let root = d.root.join("lazy").display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&root) && l.contains("crius-lazy"))
        .count()
}

async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sh(env: &PodEnv, id: &str, script: &str) -> (String, String, i32) {
    env.exec(id, &["sh", "-c", script], 30).await.unwrap()
}

#[tokio::test]
async fn a_container_runs_before_its_layers_are_pulled() {
    assert!(
        std::path::Path::new("/dev/fuse").exists(),
        "no /dev/fuse: lazy pulling needs FUSE (modprobe fuse)"
    );
    let mut env =
        PodEnv::start_with("[image]\nlazy_pull = true\nlazy_whole_pull_delay = \"1h\"\n").await;
    let blob = wire::noise(3 << 20, 7);
    let late = wire::noise(2 << 20, 8);
    let bad = wire::noise(100 << 10, 9);
    let base = lazy_layer(&busybox_entries());
    let top = lazy_layer(&[
        Entry::Dir("data".into()),
        Entry::File("data/blob.bin".into(), blob.clone(), 0o644),
        Entry::File("data/late.bin".into(), late.clone(), 0o644),
        Entry::File("data/bad.bin".into(), bad, 0o644),
        Entry::Hardlink("data/again".into(), "data/blob.bin".into()),
        Entry::File("bin/suid".into(), b"#!/bin/sh\n".to_vec(), 0o4755),
        Entry::Whiteout("etc/group".into()),
        Entry::Opaque("home".into()),
    ]);
    let bad_at = chunk_offset(&top, "data/bad.bin");
    // An image claiming the same diff IDs (so the same chain IDs) with a blob of its own: a
    // chain ID is not verified before the whole pull, so it must not give the image above
    // its files.
    let mut evil_top = lazy_layer(&[
        Entry::Dir("data".into()),
        Entry::File("data/blob.bin".into(), b"not the blob".to_vec(), 0o644),
    ]);
    evil_top.layer.diff_id = top.layer.diff_id.clone();
    let evil = annotated(vec![base.clone(), evil_top]);
    env.reg.push_image("evil", "1", &evil).await.unwrap();
    let img = annotated(vec![base, top.clone()]);
    env.reg.push_image("lazy", "1", &img).await.unwrap();
    // A byte of bad.bin's chunk changed in the registry: the TOC still names the right digest.
    let stored = env.reg.blob_file(&top.layer.digest);
    let original = std::fs::read(&stored).unwrap();
    let mut changed = original.clone();
    changed[bad_at + 40] ^= 0xff;
    std::fs::write(&stored, &changed).unwrap();

    let name = format!("{}/lazy:1", env.reg.host());
    let evil_name = format!("{}/evil:1", env.reg.host());
    let snapshots = env.d.snapshots();
    env.d.pull(&evil_name).await.expect("lazy pull");
    env.d.pull(&name).await.expect("lazy pull");
    assert_eq!(env.d.snapshots(), snapshots, "nothing unpacked yet");
    assert_eq!(
        lazy_dirs(&env.d).len(),
        3,
        "the base layer is shared, the top is not"
    );
    assert_eq!(lazy_mounts(&env.d), 3);
    for dir in lazy_dirs(&env.d) {
        let mode = std::fs::metadata(env.d.root.join("lazy").join(dir))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o700,
            "only root reaches a lazy layer's files"
        );
    }

    let sb = env.sandbox_config("lazy");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("c", &["sleep", "1000"]);
    cfg.image = Some(spec(&name));
    let id = env.run(&pod, &sb, cfg).await;
    let (out, _, code) = sh(
        &env,
        &id,
        "sha256sum /data/blob.bin; stat -c '%a %h' /bin/suid /data/again; readlink /bin/sh",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let want = format!(
        "{}  /data/blob.bin\n4755 1\n644 2\nbusybox\n",
        sha256(&blob).trim_start_matches("sha256:")
    );
    assert_eq!(out, want);
    let (out, _, _) = sh(&env, &id, "ls /etc/group /home; echo end").await;
    assert_eq!(
        out, "/home:\nend\n",
        "whiteout and opaque directory hide the lower layer"
    );
    let (_, err, code) = sh(&env, &id, "cat /data/bad.bin > /dev/null").await;
    assert_ne!(
        code, 0,
        "a chunk that does not match its digest is not served"
    );
    assert!(err.contains("Input/output error"), "{err}");

    // A restart retires the lazy layers (the image is pulled again whole when next asked for);
    // the helpers go on serving the running container, chunks it has not read included.
    std::fs::write(&stored, &original).unwrap();
    env.d.kill9();
    env.d.spawn();
    let (out, _, code) = sh(&env, &id, "sha256sum /data/late.bin").await;
    assert_eq!(code, 0);
    assert!(
        out.starts_with(sha256(&late).trim_start_matches("sha256:")),
        "{out}"
    );
    assert_eq!(
        lazy_mounts(&env.d),
        0,
        "detached: no new container uses them"
    );
    assert!(
        env.d.image_status(&name).await.is_none(),
        "an incomplete image is pulled again"
    );

    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    let d = &env.d;
    wait_for(
        "helpers ending with their container",
        Duration::from_secs(15),
        async || lazy_dirs(d).is_empty(),
    )
    .await;

    // With no delay, the whole pull follows at once, and its snapshots take over.
    let cfg_text = std::fs::read_to_string(&env.d.config).unwrap();
    std::fs::write(&env.d.config, cfg_text.replace("\"1h\"", "\"0s\"")).unwrap();
    env.d.restart();
    env.d.pull(&name).await.expect("lazy pull");
    let d = &env.d;
    wait_for(
        "the whole pull taking over",
        Duration::from_secs(30),
        async || d.snapshots().len() == snapshots.len() + 2 && lazy_dirs(d).is_empty(),
    )
    .await;
    assert_eq!(lazy_mounts(&env.d), 0);
    sums_in_a_new_pod(&env, &sb, &name, "/data/blob.bin", &blob).await;
    env.d.remove_image(&name).await.unwrap();
    env.d.remove_image(&evil_name).await.unwrap();
}

/// Runs `sha256sum PATH` from `image` in a new pod of `sb`, checks that it printed the digest
/// of `want`, and removes the pod.
async fn sums_in_a_new_pod(
    env: &PodEnv,
    sb: &cri::PodSandboxConfig,
    image: &str,
    path: &str,
    want: &[u8],
) {
    let pod = env.run_pod(sb).await.unwrap();
    let mut cfg = env.container_config("c", &["sha256sum", path]);
    cfg.image = Some(spec(image));
    let id = env.run(&pod, sb, cfg).await;
    env.wait_exit(&id, Duration::from_secs(10)).await;
    assert!(
        env.log(sb, "c")
            .contains(sha256(want).trim_start_matches("sha256:"))
    );
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn an_image_whose_layers_do_not_match_is_refused_after_its_lazy_start() {
    assert!(
        std::path::Path::new("/dev/fuse").exists(),
        "no /dev/fuse: lazy pulling needs FUSE (modprobe fuse)"
    );
    // Long enough for a pod and its container to start before the whole pull runs.
    let delay = Duration::from_secs(30);
    let mut env = PodEnv::start_with(&format!(
        "[image]\nlazy_pull = true\nlazy_whole_pull_delay = \"{}s\"\n",
        delay.as_secs()
    ))
    .await;
    let file = wire::noise(1 << 20, 11);
    let base = lazy_layer(&busybox_entries());
    let top = lazy_layer(&[
        Entry::Dir("data".into()),
        Entry::File("data/file.bin".into(), file.clone(), 0o644),
    ]);
    // The TOC and every chunk are right, so the layer is served; only the whole pull sees
    // that the config claims another diff ID.
    let mut lying_top = top.clone();
    lying_top.layer.diff_id = sha256(b"not what the layer holds");
    let liar = annotated(vec![base.clone(), lying_top]);
    env.reg.push_image("liar", "1", &liar).await.unwrap();
    let name = format!("{}/liar:1", env.reg.host());

    let pulled = Instant::now();
    env.d.pull(&name).await.expect("lazy pull");
    assert_eq!(lazy_mounts(&env.d), 2);
    let sb = env.sandbox_config("liar");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("c", &["sleep", "1000"]);
    cfg.image = Some(spec(&name));
    let id = env.run(&pod, &sb, cfg).await;
    assert!(
        pulled.elapsed() < delay,
        "the container started after the whole pull was due: the test needs a longer delay"
    );
    let want = format!(
        "{}  /data/file.bin\n",
        sha256(&file).trim_start_matches("sha256:")
    );
    let (out, _, code) = sh(&env, &id, "sha256sum /data/file.bin").await;
    assert_eq!((out.as_str(), code), (want.as_str(), 0));

    let d = &env.d;
    wait_for(
        "the whole pull refusing the image",
        delay + Duration::from_secs(60),
        async || d.image_status(&name).await.is_none(),
    )
    .await;
    assert!(
        env.d
            .list_images()
            .await
            .iter()
            .all(|i| i.id != liar.config_digest),
        "a refused image is not listed"
    );
    assert!(env.d.image_status(&liar.config_digest).await.is_none());
    let log = env.d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("did not match their digests")
                && l.contains(&top.layer.digest)
                && l.contains(&liar.config_digest)),
        "the refusal is logged with the image and the layer"
    );
    assert_eq!(
        lazy_mounts(&env.d),
        0,
        "retired: no new container uses them"
    );
    assert_eq!(
        lazy_dirs(&env.d).len(),
        2,
        "the helpers serve the running container"
    );
    let (out, _, code) = sh(&env, &id, "sha256sum /data/file.bin; echo still here").await;
    assert_eq!(code, 0, "the container started before keeps running: {out}");
    assert_eq!(out, format!("{want}still here\n"));

    let mut cfg = env.container_config("d", &["true"]);
    cfg.image = Some(spec(&name));
    let err = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(&name), "{}", err.message());
    assert!(
        err.message().contains("did not match their digests"),
        "{}",
        err.message()
    );

    // Pulled again, the layer is not served lazily: the pull is whole and fails as it should.
    let err = env.d.pull(&name).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::DataLoss, "{err:?}");
    assert!(
        err.message().contains(&top.layer.digest)
            && err.message().contains("the image config says"),
        "{}",
        err.message()
    );
    assert_eq!(lazy_mounts(&env.d), 0);
    assert!(env.d.image_status(&name).await.is_none());

    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    wait_for(
        "helpers ending with their container",
        Duration::from_secs(15),
        async || lazy_dirs(d).is_empty(),
    )
    .await;
    assert_eq!(lazy_mounts(&env.d), 0);

    // A right image under the same name, its whole pull at once: it is served and taken over.
    let honest = annotated(vec![base, top]);
    env.reg.push_image("liar", "1", &honest).await.unwrap();
    let cfg_text = std::fs::read_to_string(&env.d.config).unwrap();
    let at_once = cfg_text.replace(&format!("\"{}s\"", delay.as_secs()), "\"0s\"");
    std::fs::write(&env.d.config, at_once).unwrap();
    env.d.restart();
    let image_ref = env.d.pull(&name).await.expect("a right image pulls");
    assert_eq!(image_ref, honest.config_digest);
    let d = &env.d;
    wait_for(
        "the whole pull taking over",
        Duration::from_secs(60),
        async || {
            lazy_dirs(d).is_empty()
                && d.image_status(&name)
                    .await
                    .is_some_and(|i| i.id == honest.config_digest)
        },
    )
    .await;
    sums_in_a_new_pod(&env, &sb, &name, "/data/file.bin", &file).await;
    env.d.remove_image(&name).await.unwrap();
    assert_eq!(lazy_mounts(&env.d), 0);
    assert!(lazy_dirs(&env.d).is_empty());
}
