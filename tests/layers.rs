//! Images of unusual shape, and layers made by other producers than the tests' own tar writer
//! (GNU tar, Python's tarfile), from pull to a running container: 200 layers (an overlay whose
//! options outgrow the page mount(2) takes), long and non-UTF-8 names, set-id and sticky modes,
//! high owners, a hardlink to a symlink, a whiteout then the same directory again, 20,000 files,
//! an empty layer. The VM tier runs the 200 layers again under Debian 12's own kernel 6.1,
//! which has no `lowerdir+`: there the overlay takes the descriptor path.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use common::*;
use crius::cri::v1 as cri;

/// busybox under 199 layers of one file each: 200 in all, as containerd runs them.
async fn two_hundred_layers(env: &PodEnv) -> (String, String) {
    let mut layers = vec![busybox_layer(Compress::Gzip)];
    for n in 1..200 {
        layers.push(layer(
            &[
                Entry::Dir("layers".into()),
                Entry::File(format!("layers/{n:03}"), n.to_string().into_bytes(), 0o644),
            ],
            Compress::Gzip,
        ));
    }
    let img = image(layers, &ImageOpts::default());
    env.reg.push_image("tall", "200", &img).await.unwrap();
    let name = format!("{}/tall:200", env.reg.host());
    let id = env.d.pull(&name).await.unwrap();
    (name, id)
}

#[tokio::test]
async fn an_image_of_two_hundred_layers_runs() {
    require_root();
    let env = PodEnv::start().await;
    let (name, id) = two_hundred_layers(&env).await;
    let sb = env.sandbox_config("tall");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("tall", &["sleep", "100000"]);
    cfg.image = Some(spec(&name));
    // The same layers as an image volume: an overlay without an upper layer.
    cfg.mounts.push(cri::Mount {
        container_path: "/mnt/tall".into(),
        readonly: true,
        image: Some(cri::ImageSpec {
            image: id,
            ..Default::default()
        }),
        ..Default::default()
    });
    let c = env.run(&pod, &sb, cfg).await;
    let (out, err, code) = env
        .exec(
            &c,
            &[
                "sh",
                "-c",
                "ls /layers | wc -l; cat /layers/001 /layers/199; echo; \
                 ls /mnt/tall/layers | wc -l; echo written > /written && cat /written",
            ],
            20,
        )
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["199", "1199", "199", "written"],
        "{out}"
    );
    env.remove_pod(&pod).await;
}

/// Python's tarfile, as a script that writes its layers into the directory it is given: PAX
/// long names, a name that is not UTF-8, set-id and sticky modes, owners past 2^31, a hardlink to
/// a symlink, a whiteout followed by the directory made again, and 20,000 files.
const PYTHON_LAYERS: &str = r##"
import io, sys, tarfile
out = sys.argv[1]

def add(t, name, kind=tarfile.REGTYPE, data=b"", mode=0o644, link="", uid=0, gid=0):
    i = tarfile.TarInfo(name)
    i.type, i.mode, i.linkname, i.uid, i.gid, i.mtime = kind, mode, link, uid, gid, 1700000000
    i.size = len(data)
    t.addfile(i, io.BytesIO(data) if data else None)

with tarfile.open(out + "/python.tar", "w", format=tarfile.PAX_FORMAT,
                  encoding="utf-8", errors="surrogateescape") as t:
    add(t, "pax/" + "d" * 120 + "/" + "f" * 150, data=b"pax-long")
    add(t, "nonutf/caf\udce9", data=b"latin")
    add(t, "bin/suid", data=b"#!/bin/sh\n", mode=0o4755)
    add(t, "sticky", tarfile.DIRTYPE, mode=0o1777)
    add(t, "owned", data=b"high", uid=4000000000, gid=4000000001)
    add(t, "target", data=b"pointed")
    add(t, "link", tarfile.SYMTYPE, link="target", mode=0o777)
    add(t, "hard", tarfile.LNKTYPE, link="link")
    add(t, ".wh.dir")
    add(t, "dir", tarfile.DIRTYPE, mode=0o755)
    add(t, "dir/new", data=b"new")

with tarfile.open(out + "/many.tar", "w", format=tarfile.GNU_FORMAT) as t:
    add(t, "many", tarfile.DIRTYPE, mode=0o755)
    for n in range(20000):
        add(t, "many/%05d" % n, data=b"m")
"##;

fn run_tool(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn layers_from_gnu_tar_and_python() {
    require_root();
    let env = PodEnv::start().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    // The lower layer the whiteout hides.
    let lower = layer(
        &[
            Entry::Dir("dir".into()),
            Entry::File("dir/old".into(), b"old".to_vec(), 0o644),
            Entry::Dir("dir/sub".into()),
            Entry::File("dir/sub/deep".into(), b"deep".to_vec(), 0o644),
        ],
        Compress::Gzip,
    );
    run_tool(
        std::process::Command::new("/usr/bin/python3")
            .args(["-c", PYTHON_LAYERS])
            .arg(out),
    );
    // GNU tar over a tree on disk: a GNU long name, in its own format, and an empty archive.
    let tree = out.join("tree");
    let long = format!("gnu/{}/{}", "g".repeat(110), "h".repeat(120));
    std::fs::create_dir_all(tree.join(&long).parent().unwrap()).unwrap();
    std::fs::write(tree.join(&long), b"gnu-long").unwrap();
    run_tool(
        std::process::Command::new("tar")
            .args(["--format=gnu", "--owner=0", "--group=0", "-C"])
            .arg(&tree)
            .arg("-cf")
            .arg(out.join("gnu.tar"))
            .arg("."),
    );
    run_tool(
        std::process::Command::new("tar")
            .arg("-cf")
            .arg(out.join("empty.tar"))
            .args(["-T", "/dev/null"]),
    );
    let read = |name: &str| std::fs::read(out.join(name)).unwrap();
    let img = image(
        vec![
            busybox_layer(Compress::Gzip),
            lower,
            layer_from_tar(read("python.tar"), Compress::Gzip),
            layer_from_tar(read("many.tar"), Compress::Zstd),
            layer_from_tar(read("gnu.tar"), Compress::None),
            layer_from_tar(read("empty.tar"), Compress::Gzip),
        ],
        &ImageOpts::default(),
    );
    env.reg.push_image("outside", "1", &img).await.unwrap();
    let name = format!("{}/outside:1", env.reg.host());
    env.d.pull(&name).await.unwrap();
    let sb = env.sandbox_config("outside");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("outside", &["sleep", "100000"]);
    cfg.image = Some(spec(&name));
    let c = env.run(&pod, &sb, cfg).await;
    let script = format!(
        "cat /pax/{}/{}; echo; cat /nonutf/*; echo; ls /nonutf | wc -l; \
         stat -c '%a' /bin/suid /sticky; stat -c '%u:%g' /owned; readlink /hard; \
         ls -A /dir; ls /many | wc -l; cat /{long}; echo",
        "d".repeat(120),
        "f".repeat(150)
    );
    let (stdout, err, code) = env.exec(&c, &["sh", "-c", &script], 30).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        [
            "pax-long",
            "latin",
            "1",
            "4755",
            "1777",
            "4000000000:4000000001",
            "target",
            // Only what the whiteout's layer made again: the lower dir/old and dir/sub are gone.
            "new",
            "20000",
            "gnu-long",
        ],
        "{stdout}"
    );
    env.remove_pod(&pod).await;
}
