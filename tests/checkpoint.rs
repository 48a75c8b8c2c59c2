//! Checkpoint and restore with CRIU: a running container checkpointed to an archive keeps
//! running; a container created from the archive in another pod continues its processes where
//! they were (a counter goes on from its count, a listening socket still answers, its stdout
//! still reaches the log) with the files it wrote and deleted. CRIU needs what the host's kernel
//! lacks (it fails on the host's vDSO), so that part runs in the VM tier; the refusals run here.
//! CheckpointPod and RestorePod are in `pod`.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;
#[path = "checkpoint/pod.rs"]
mod pod;

use std::time::Duration;

use common::*;
use crius::cri::v1 as cri;

/// A counter, a web server, a file written and one deleted, and a writer that keeps `/grow` open
/// read-write and writes to it 100 times a second. CRIU records the size of every open file
/// (but a write-only append one, a log) and refuses to restore one whose size differs in the
/// rootfs diff, so a diff taken while the container ran on after the dump (the race the freeze
/// closes) fails the restore (seen: "File grow has bad size 346 (expect 342)").
const COUNTER: &[&str] = &[
    "sh",
    "-c",
    "(exec 3<>/grow; while true; do echo x >&3; usleep 10000; done) & \
     mkdir -p /www && echo served > /www/index.html && httpd -p 127.0.0.1:8080 -h /www && \
     echo kept > /kept && rm /bin/vi && \
     i=0; while true; do i=$((i+1)); echo $i > /count; echo count $i; sleep 0.2; done",
];

/// The masked and read-only paths kubelet asks for every container: masked files are the host's
/// `/dev/null`, which the checkpoint names as external.
fn with_kubelet_masks(mut cfg: cri::ContainerConfig) -> cri::ContainerConfig {
    let sc = cfg
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default);
    sc.masked_paths = [
        "/proc/asound",
        "/proc/acpi",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/sys/firmware",
        "/sys/devices/virtual/powercap",
    ]
    .map(String::from)
    .into();
    sc.readonly_paths = [
        "/proc/bus",
        "/proc/fs",
        "/proc/irq",
        "/proc/sys",
        "/proc/sysrq-trigger",
    ]
    .map(String::from)
    .into();
    cfg
}

/// The config that turns restore through CreateContainer on (it is off by default).
const RESTORE_ON: &str = "[checkpoint]\nrestore_from_archive = true\n";

async fn checkpoint(env: &PodEnv, id: &str, at: &str) -> Result<(), tonic::Status> {
    env.d
        .runtime()
        .checkpoint_container(cri::CheckpointContainerRequest {
            container_id: id.into(),
            location: at.into(),
            timeout: 60,
        })
        .await
        .map(drop)
}

/// The counter's value once it is above `floor` (it writes /count anew five times a second; a
/// read between the truncation and the write finds it empty).
async fn count_above(env: &PodEnv, id: &str, floor: u64) -> u64 {
    let t = std::time::Instant::now();
    loop {
        let out = env.exec(id, &["cat", "/count"], 10).await.unwrap();
        match out.0.trim().parse::<u64>() {
            Ok(n) if n > floor => return n,
            _ => {}
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the counter did not go above {floor}: {:?}",
            out.0
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[ignore = "CRIU fails on the host kernel's vDSO; runs in the VM tier"]
async fn a_checkpointed_container_goes_on_in_another_pod() {
    goes_on_in_another_pod(PodEnv::start_with(RESTORE_ON).await).await;
}

/// The same under the systemd cgroup driver: criu's process is placed in the restored
/// container's scope before it restores anything.
#[tokio::test]
#[ignore = "CRIU and systemd as PID 1: runs in the VM tier's systemd boot"]
async fn a_checkpointed_container_goes_on_under_the_systemd_driver() {
    assert!(
        std::path::Path::new("/run/systemd/system").is_dir(),
        "systemd is not PID 1 here"
    );
    let env = PodEnv::start_with(&format!("{RESTORE_ON}[cgroup]\ndriver = \"systemd\"\n")).await;
    goes_on_in_another_pod(env).await;
}

async fn goes_on_in_another_pod(env: PodEnv) {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("counter.tar");
    let sb = env.sandbox_config("first");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(
            &pod,
            &sb,
            with_kubelet_masks(env.container_config("counter", COUNTER)),
        )
        .await;
    // Counted for a while (five a second): a restore that started over would show less.
    let before = count_above(&env, &c, 5).await;
    // A second checkpoint asked for meanwhile is refused (they would share a work directory,
    // and its end would thaw the first's frozen cgroup), or runs after it.
    let other = dir.path().join("other.tar");
    let (first, second) = tokio::join!(checkpoint(&env, &c, archive.to_str().unwrap()), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        checkpoint(&env, &c, other.to_str().unwrap()).await
    });
    first.unwrap();
    if let Err(e) = second {
        assert!(e.message().contains("being taken"), "{e:?}");
        assert!(!other.exists());
    }
    // The archive in the layout CRI-O and containerd write.
    let names: Vec<String> = tar::Archive::new(std::fs::File::open(&archive).unwrap())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    for want in [
        "config.dump",
        "spec.dump",
        "rootfs-diff.tar",
        "deleted.files",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    assert!(
        names.iter().any(|n| n.starts_with("checkpoint/")),
        "{names:?}"
    );
    // The checkpointed container kept running.
    assert_eq!(
        env.status(&c).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    let at_checkpoint = count_above(&env, &c, before).await;

    // Restored into another pod: the image is the archive's path.
    let sb2 = env.sandbox_config("second");
    let pod2 = env.run_pod(&sb2).await.unwrap();
    // Not run: a container started instead of restored would have no /count.
    let mut cfg = with_kubelet_masks(env.container_config("restored", &["sleep", "1000"]));
    cfg.image = Some(spec(archive.to_str().unwrap()));
    let r = env.create(&pod2, &sb2, cfg).await.unwrap();
    env.start_container(&r).await.unwrap();
    assert_eq!(
        env.status(&r).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    let restored = count_above(&env, &r, 0).await;
    // It went on from its count: not from 1, not beyond what the original had reached.
    assert!(
        restored >= before,
        "restored at {restored}, checkpointed after {before}"
    );
    // It counts on.
    count_above(&env, &r, restored).await;
    // Its rootfs changes came along: a file written, a file of the image deleted.
    let files = env
        .exec(&r, &["sh", "-c", "cat /kept; ls /bin/vi 2>&1"], 10)
        .await
        .unwrap();
    let text = &files.0;
    assert!(text.starts_with("kept\n"), "{text}");
    assert!(text.contains("No such file"), "{text}");
    // Its masks came back: a masked file reads empty, a masked directory is empty, and
    // /proc/sys stays read-only.
    let masks = env
        .exec(
            &r,
            &[
                "sh",
                "-c",
                "wc -c < /proc/timer_list; ls /sys/firmware | wc -l; echo 1 > /proc/sys/kernel/ns_last_pid || echo refused",
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(
        masks.0.split_whitespace().collect::<Vec<_>>(),
        ["0", "0", "refused"],
        "{masks:?}"
    );
    // Its listening socket answers in the new pod.
    let web = env
        .exec(&r, &["wget", "-qO-", "http://127.0.0.1:8080/"], 10)
        .await
        .unwrap();
    assert_eq!(web.0, "served\n");
    // Its stdout reaches the new container's log.
    let t = std::time::Instant::now();
    loop {
        let log = env.log(&sb2, "restored");
        if log_lines(&log, "stdout")
            .iter()
            .any(|l| l.starts_with("count "))
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no output in the restored log: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both go on independently; stopping the restored one ends it like any container.
    count_above(&env, &c, at_checkpoint).await;
    env.d
        .runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: r.clone(),
            timeout: 2,
        })
        .await
        .unwrap();
    assert_eq!(
        env.status(&r).await.state,
        cri::ContainerState::ContainerExited as i32
    );
    for p in [&pod, &pod2] {
        env.stop_pod(p).await;
        env.remove_pod(p).await;
    }
}

#[tokio::test]
async fn checkpoints_refused_with_reasons() {
    require_root();
    let env = PodEnv::start_with(RESTORE_ON).await;
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("c.tar");
    let at = at.to_str().unwrap();
    let sb = env.sandbox_config("refusals");
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env
        .run(&pod, &sb, env.container_config("c", &["sleep", "1000"]))
        .await;
    let e = checkpoint(&env, &c, "c.tar").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("location"), "{e:?}");
    let e = checkpoint(&env, "nosuch", at).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    // A terminal cannot be dumped.
    let mut tty = env.container_config("tty", &["sleep", "1000"]);
    tty.tty = true;
    let t = env.run(&pod, &sb, tty).await;
    let e = checkpoint(&env, &t, at).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("terminal"), "{e:?}");
    // Nor a container that has ended.
    let ended = env
        .run(&pod, &sb, env.container_config("ended", &["true"]))
        .await;
    env.wait_exit(&ended, Duration::from_secs(10)).await;
    let e = checkpoint(&env, &ended, at).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(!std::path::Path::new(at).exists());
    // A file that is no checkpoint, given as the image.
    let junk = dir.path().join("junk.tar");
    std::fs::write(&junk, b"not a tar").unwrap();
    let mut cfg = env.container_config("junk", &[]);
    cfg.image = Some(spec(junk.to_str().unwrap()));
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("checkpoint archive"), "{e:?}");
    // An archive whose image this node does not have.
    let mut b = tar::Builder::new(Vec::new());
    let dump = br#"{"rootfsImage":"example.org/gone:1","rootfsImageName":"example.org/gone:1"}"#;
    let mut h = header();
    h.set_size(dump.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "config.dump", &dump[..]).unwrap();
    let other = dir.path().join("other.tar");
    std::fs::write(&other, seal_tar(&env, &b.into_inner().unwrap(), None)).unwrap();
    let mut cfg = env.container_config("other", &[]);
    cfg.image = Some(spec(other.to_str().unwrap()));
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(e.message().contains("example.org/gone:1"), "{e:?}");
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

/// Restore through CreateContainer is off unless the config turns it on: the archive is not
/// read, and the error names the key.
#[tokio::test]
async fn restore_is_off_by_default() {
    require_root();
    let env = PodEnv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sb = env.sandbox_config("off");
    let pod = env.run_pod(&sb).await.unwrap();
    let archive = dir.path().join("a.tar");
    std::fs::write(&archive, hostile_archive(&env, &[])).unwrap();
    let mut cfg = env.container_config("off", &[]);
    cfg.image = Some(spec(archive.to_str().unwrap()));
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("checkpoint.restore_from_archive"),
        "{e:?}"
    );
    assert_nothing_left(&env, &pod).await;
    // RestorePod too, before its checkpoint is looked at.
    let mut sb2 = env.sandbox_config("off-restored");
    sb2.metadata.as_mut().unwrap().uid = "uid-off-restored".into();
    let e = env
        .d
        .runtime()
        .restore_pod(cri::RestorePodRequest {
            checkpoint_path: dir.path().display().to_string(),
            config: Some(sb2),
            runtime_handler: String::new(),
            options: Default::default(),
            container_configs: vec![env.container_config("off", &[])],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("checkpoint.restore_from_archive"),
        "{e:?}"
    );
    let listed = env
        .d
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

/// Without criu, an archive is refused before it is read, naming criu.
#[tokio::test]
async fn restore_without_criu_reads_nothing() {
    require_root();
    let mut env = PodEnv::start_with(RESTORE_ON).await;
    let sb = env.sandbox_config("nocriu");
    let pod = env.run_pod(&sb).await.unwrap();
    // A PATH without criu (and without anything else: the daemon needs none of it here).
    let empty = tempfile::tempdir().unwrap();
    env.d
        .env
        .push(("PATH".into(), empty.path().display().to_string()));
    // What a daemon that ended mid-restore left unpacked goes at the next start.
    let stale = env.d.state.join("restore/stale");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("config.dump"), b"{}").unwrap();
    env.d.restart();
    assert!(!stale.exists());
    // Not even a tar: criu's absence is what is reported.
    let archive = empty.path().join("junk.tar");
    std::fs::write(&archive, b"not a tar").unwrap();
    let mut cfg = env.container_config("nocriu", &[]);
    cfg.image = Some(spec(archive.to_str().unwrap()));
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("criu is not installed"), "{e:?}");
    assert_nothing_left(&env, &pod).await;
    env.d.env.clear();
    env.d.restart();
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

/// A member of a hand-made archive.
enum Member<'a> {
    File(&'a str, Vec<u8>),
    Dir(&'a str),
    Link(&'a str, &'a str),
    Fifo(&'a str),
    /// A character device node (1, 3: the host's /dev/null).
    Device(&'a str),
    /// A hard link to `target`, a path the archive does not hold.
    HardLink(&'a str, &'a str),
    /// A GNU sparse member whose holes would make `size` bytes.
    Sparse(&'a str, u64),
}

/// An archive in crius's layout for `env`'s image (config.dump, crius.json, descriptors.json,
/// checkpoint/), where `over` replaces or adds members of the same name.
fn hostile_archive(env: &PodEnv, over: &[Member<'_>]) -> Vec<u8> {
    let dump = serde_json::json!({"rootfsImage": env.image, "rootfsImageName": env.image});
    let mut members = vec![
        Member::File("config.dump", dump.to_string().into_bytes()),
        Member::File(
            "crius.json",
            br#"{"mounts":[],"net":"crius-pod-net"}"#.to_vec(),
        ),
        Member::File(
            "descriptors.json",
            br#"["pipe:[1]","pipe:[2]","pipe:[3]"]"#.to_vec(),
        ),
        Member::Dir("checkpoint"),
        Member::File("checkpoint/inventory.img", b"not criu's".to_vec()),
    ];
    let name = |m: &Member<'_>| match m {
        Member::File(n, _)
        | Member::Dir(n)
        | Member::Link(n, _)
        | Member::Fifo(n)
        | Member::Device(n)
        | Member::HardLink(n, _)
        | Member::Sparse(n, _) => n.to_string(),
    };
    for o in over {
        let n = name(o);
        members.retain(|m| {
            let m = name(m);
            m != n && !m.starts_with(&format!("{n}/"))
        });
    }
    let mut b = tar::Builder::new(Vec::new());
    for m in members.iter().chain(over) {
        let mut h = header();
        h.set_mode(0o644);
        h.set_size(0);
        match m {
            Member::File(n, data) => {
                h.set_size(data.len() as u64);
                b.append_data(&mut h, n, &data[..]).unwrap();
            }
            Member::Dir(n) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                b.append_data(&mut h, n, &[][..]).unwrap();
            }
            Member::Link(n, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, n, target).unwrap();
            }
            Member::Fifo(n) => {
                h.set_entry_type(tar::EntryType::Fifo);
                b.append_data(&mut h, n, &[][..]).unwrap();
            }
            Member::Device(n) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
                b.append_data(&mut h, n, &[][..]).unwrap();
            }
            Member::HardLink(n, target) => {
                h.set_entry_type(tar::EntryType::Link);
                b.append_link(&mut h, n, target).unwrap();
            }
            Member::Sparse(n, size) => {
                // One byte of data at the end: the rest, holes the tar crate would fill.
                h.set_path(n).unwrap();
                h.set_entry_type(tar::EntryType::GNUSparse);
                h.set_size(1);
                let g = h.as_gnu_mut().unwrap();
                g.set_real_size(*size);
                octal(&mut g.sparse[0].offset, size - 1);
                octal(&mut g.sparse[0].numbytes, 1);
                h.set_cksum();
                b.append(&h, &b"x"[..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// The node's images with their tags, in order.
/// The archive `hostile_archive` makes, of files and directories only, sealed as a dump is:
/// under the daemon's checkpoint key (made here when the daemon has none yet), or under `key`.
/// It is what someone holding the key could make.
fn sealed_archive(env: &PodEnv, over: &[Member<'_>], key: Option<[u8; 32]>) -> Vec<u8> {
    seal_tar(env, &hostile_archive(env, over), key)
}

/// `tar` (of files and directories only) sealed as `sealed_archive` seals.
fn seal_tar(env: &PodEnv, unsealed: &[u8], key: Option<[u8; 32]>) -> Vec<u8> {
    use crius::container::seal;
    let work = tempfile::tempdir().unwrap();
    tar::Archive::new(unsealed).unpack(work.path()).unwrap();
    let key = match key {
        Some(k) => seal::SealKey::from_bytes(&k),
        None => seal::SealKey::load_or_make(&env.d.root.join(seal::KEY_FILE)).unwrap(),
    };
    seal::seal(work.path(), &key).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", work.path()).unwrap();
    b.into_inner().unwrap()
}

async fn images_and_tags(env: &PodEnv) -> Vec<(String, Vec<String>)> {
    let mut images: Vec<_> = env
        .d
        .list_images()
        .await
        .into_iter()
        .map(|i| {
            let mut tags = i.repo_tags;
            tags.sort();
            (i.id, tags)
        })
        .collect();
    images.sort();
    images
}

/// A GNU header with the numeric fields a tar reader needs.
fn header() -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

/// A tar header's octal number field.
fn octal(field: &mut [u8; 12], n: u64) {
    field.copy_from_slice(format!("{n:011o}\0").as_bytes());
}

/// Nothing of a refused restore is left: no container, no bundle or layer, no unpacked
/// archive, no mount.
async fn assert_nothing_left(env: &PodEnv, pod: &str) {
    let listed = env
        .d
        .runtime()
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: pod.into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(listed.is_empty(), "{listed:?}");
    assert_no_bundle_or_mount(env, "a failed restore");
}

/// No container bundle, layer or unpacked archive is left in the daemon's directories, and
/// nothing is mounted below them; `what` names the case.
fn assert_no_bundle_or_mount(env: &PodEnv, what: &str) {
    for d in [
        env.d.state.join("containers"),
        env.d.root.join("containers"),
        env.d.state.join("restore"),
    ] {
        let left: Vec<_> = std::fs::read_dir(&d)
            .map(|r| r.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{what}: left in {}: {left:?}", d.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for d in [
        env.d.state.join("containers"),
        env.d.root.join("containers"),
    ] {
        let d = d.display().to_string();
        assert!(
            !mounts.lines().any(|l| l.contains(&d)),
            "{what}: a mount below {d} is left"
        );
    }
}

/// Hostile archives (links to host files, FIFOs and devices, sparse and oversized members, a
/// `checkpoint/` that is a link) are refused at CreateContainer, quickly, naming the member,
/// before criu could see them; the daemon answers on and nothing is left.
#[tokio::test]
async fn hostile_archives_are_refused() {
    require_root();
    if which("criu").is_none() {
        missing("criu");
        return;
    }
    let env = PodEnv::start_with(RESTORE_ON).await;
    let dir = tempfile::tempdir().unwrap();
    let sb = env.sandbox_config("hostile");
    let pod = env.run_pod(&sb).await.unwrap();
    // What the links lead to on the host: a layer tar that would plant a file, a FIFO no one
    // writes, a directory of "images".
    let planted = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = header();
        h.set_size(7);
        h.set_mode(0o644);
        b.append_data(&mut h, "planted", &b"planted"[..]).unwrap();
        b.into_inner().unwrap()
    };
    let host_tar = dir.path().join("host.tar");
    std::fs::write(&host_tar, planted).unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let host_dir = dir.path().join("images");
    std::fs::create_dir(&host_dir).unwrap();
    std::fs::write(host_dir.join("inventory.img"), b"host").unwrap();
    let (host_tar, fifo, host_dir) = (
        host_tar.to_str().unwrap(),
        fifo.to_str().unwrap(),
        host_dir.to_str().unwrap(),
    );
    let big = vec![b' '; 5 << 20];
    // Every file a dump holds, each made every hostile kind of member in turn.
    let files = [
        "config.dump",
        "spec.dump",
        "crius.json",
        "descriptors.json",
        "deleted.files",
        "rootfs-diff.tar",
        "checkpoint/inventory.img",
        "checkpoint/pages-1.img",
    ];
    let mut cases: Vec<(String, Vec<Member<'_>>, &str)> = Vec::new();
    for file in files {
        let shown = file.rsplit('/').next().unwrap();
        let mut kinds: Vec<(&str, Member<'_>)> = vec![
            ("linked to a host tar", Member::Link(file, host_tar)),
            ("linked to a host FIFO", Member::Link(file, fifo)),
            ("linked to /dev/zero", Member::Link(file, "/dev/zero")),
            ("a FIFO", Member::Fifo(file)),
            ("a device node", Member::Device(file)),
            (
                "a hard link to a host file",
                Member::HardLink(file, "/etc/passwd"),
            ),
            ("a 6 GiB sparse member", Member::Sparse(file, 6 << 30)),
        ];
        if !file.contains('/') && file != "rootfs-diff.tar" {
            kinds.push((
                "5 MiB, over the 4 MiB bound",
                Member::File(file, big.clone()),
            ));
        }
        for (kind, m) in kinds {
            cases.push((format!("{file} as {kind}"), vec![m], shown));
        }
    }
    cases.extend([
        (
            "checkpoint/ linked to a host directory".to_string(),
            vec![Member::Link("checkpoint", host_dir)],
            "checkpoint",
        ),
        (
            "a whiteout member (a device node once unpacked)".to_string(),
            vec![Member::File(".wh.extra", Vec::new())],
            "extra",
        ),
    ]);
    for (i, (what, over, member)) in cases.into_iter().enumerate() {
        let archive = dir.path().join(format!("case{i}.tar"));
        std::fs::write(&archive, hostile_archive(&env, &over)).unwrap();
        let mut cfg = env.container_config(&format!("hostile{i}"), &["sleep", "1000"]);
        cfg.image = Some(spec(archive.to_str().unwrap()));
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(20), env.create(&pod, &sb, cfg))
            .await
            .unwrap_or_else(|_| panic!("{what}: CreateContainer still runs after 20 s"));
        let e = match answer {
            Ok(id) => panic!("{what}: created {id}"),
            Err(e) => e,
        };
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains(member), "{what}: {e:?}");
        assert!(e.message().contains("config.image.image"), "{what}: {e:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: refused after {:?}",
            started.elapsed()
        );
        // The daemon answers on.
        let v = tokio::time::timeout(
            Duration::from_secs(5),
            env.d.runtime().version(cri::VersionRequest::default()),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: Version does not answer"));
        assert!(v.is_ok(), "{what}: {v:?}");
        assert_nothing_left(&env, &pod).await;
    }
    // Well formed, but not what this node's crius dumped: criu trusts its images whole
    // (credentials, capabilities, namespaces, mounts), so none reaches it.
    let tampered = {
        let a = sealed_archive(&env, &[], None);
        let at = find(&a, b"not criu's").unwrap();
        let mut a = a;
        a[at] = b'N';
        a
    };
    for (what, archive, why) in [
        (
            "an unsealed archive",
            hostile_archive(&env, &[]),
            "no crius.seal",
        ),
        (
            "an archive sealed under another key",
            sealed_archive(&env, &[], Some([7; 32])),
            "does not match",
        ),
        ("a sealed archive changed after", tampered, "does not match"),
    ] {
        let at = dir.path().join("unsealed.tar");
        std::fs::write(&at, archive).unwrap();
        let mut cfg = env.container_config("unsealed", &["sleep", "1000"]);
        cfg.image = Some(spec(at.to_str().unwrap()));
        let e = env.create(&pod, &sb, cfg).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains(why), "{what}: {e:?}");
        assert_nothing_left(&env, &pod).await;
    }
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

/// Where `needle` first starts in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A restored container gets what its new config asks for and nothing of the archive's saved
/// config (devices, mounts, annotations, CDI devices), and no image is tagged by the archive.
#[tokio::test]
async fn restore_takes_only_the_new_config() {
    require_root();
    if which("criu").is_none() {
        missing("criu");
        return;
    }
    let env = PodEnv::start_with(RESTORE_ON).await;
    let dir = tempfile::tempdir().unwrap();
    let sb = env.sandbox_config("onlynew");
    let pod = env.run_pod(&sb).await.unwrap();
    let images_before = images_and_tags(&env).await;
    // The saved config names the image by its reference and asks for a retag; the saved spec
    // and config carry a host device, a host mount, annotations and a CDI device.
    let dump = serde_json::json!({
        "rootfsImage": env.image,
        "rootfsImageRef": env.image,
        "rootfsImageName": "example.org/retagged:latest",
        "annotations": {"smuggled": "yes", "cdi.k8s.io/x": "vendor.com/gpu=all"},
        "cdiDevices": [{"name": "vendor.com/gpu=all"}],
        "devices": [{"host_path": "/dev/kmsg", "container_path": "/dev/kmsg"}],
        "mounts": [{"host_path": "/etc", "container_path": "/host-etc"}],
    });
    // The saved spec is what crius made for such a container (so it grants what the new config
    // does), with a host mount, a device and an annotation added.
    let probe = env
        .create(&pod, &sb, env.container_config("probe", &["sleep", "1000"]))
        .await
        .unwrap();
    let probe_bundle = env.d.state.join("containers").join(&probe);
    let mut saved_spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(probe_bundle.join("config.json")).unwrap()).unwrap();
    env.d
        .runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: probe,
        })
        .await
        .unwrap();
    saved_spec["annotations"] = serde_json::json!({"smuggled": "yes"});
    saved_spec["mounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(
            {"destination": "/host-etc", "source": "/etc", "type": "bind", "options": ["rbind"]}
        ));
    saved_spec["linux"]["devices"] =
        serde_json::json!([{"path": "/dev/kmsg", "type": "c", "major": 1, "minor": 11}]);
    let archive = dir.path().join("a.tar");
    std::fs::write(
        &archive,
        sealed_archive(
            &env,
            &[
                Member::File("config.dump", dump.to_string().into_bytes()),
                Member::File("spec.dump", saved_spec.to_string().into_bytes()),
            ],
            None,
        ),
    )
    .unwrap();
    let mut cfg = env.container_config("onlynew", &["sleep", "1000"]);
    cfg.image = Some(spec(archive.to_str().unwrap()));
    cfg.annotations = [("asked".to_string(), "by-the-new-config".to_string())].into();
    let id = env.create(&pod, &sb, cfg).await.unwrap();
    let st = env.status(&id).await;
    assert_eq!(
        st.annotations,
        [("asked".to_string(), "by-the-new-config".to_string())].into(),
        "{st:?}"
    );
    let bundle = env.d.state.join("containers").join(&id);
    let oci: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let text = oci.to_string();
    for smuggled in ["/dev/kmsg", "/host-etc", "smuggled", "vendor.com/gpu"] {
        assert!(!text.contains(smuggled), "{smuggled} in {text}");
    }
    // No image was tagged or retagged.
    assert_eq!(images_before, images_and_tags(&env).await);
    // The unpacked archive is the container's, and goes with it.
    assert!(bundle.join("restore/checkpoint/inventory.img").is_file());
    env.d
        .runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    assert_nothing_left(&env, &pod).await;
    // A checkpoint of a container that held more than this config grants (criu would restore
    // its processes with it) is refused, naming the field, though its seal holds.
    saved_spec["process"]["capabilities"]["bounding"]
        .as_array_mut()
        .unwrap()
        .push("CAP_SYS_ADMIN".into());
    std::fs::write(
        &archive,
        sealed_archive(
            &env,
            &[
                Member::File("config.dump", dump.to_string().into_bytes()),
                Member::File("spec.dump", saved_spec.to_string().into_bytes()),
            ],
            None,
        ),
    )
    .unwrap();
    let mut cfg = env.container_config("more", &["sleep", "1000"]);
    cfg.image = Some(spec(archive.to_str().unwrap()));
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("capabilities") && e.message().contains("CAP_SYS_ADMIN"),
        "{e:?}"
    );
    assert_nothing_left(&env, &pod).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}
