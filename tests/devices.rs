//! CDI devices from a spec file to a running container: the device node, environment, mount,
//! extra group and hooks a spec gives, asked for by `cdi_devices` and by annotation; specs
//! written while the daemon runs; and the refusals that name the device and the file. The
//! device controller's half (the node opens, nothing else does) needs cgroup v2 and runs in
//! the VM tier (`tests/cgroups.rs`).

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use crius::cri::v1 as cri;
use tonic::Code;

const LONG: &[&str] = &["sleep", "100000"];

/// A spec (YAML, as drivers often write them) for `crius.test/dev`: device `fake0` is a node
/// made in `dir` with /dev/kmsg's numbers (1:11, not among a container's default devices),
/// given write access only; the spec's own edits add a mount, a group and one hook of each kind
/// that writes what it read into `dir`.
fn spec_yaml(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"cdiVersion: 0.7.0
kind: crius.test/dev
devices:
  - name: fake0
    containerEdits:
      env: [CDI_DEVICE=fake0]
      deviceNodes:
        - path: /dev/crius-fake0
          hostPath: {d}/fake0
          permissions: w
containerEdits:
  env: [CDI_VENDOR=crius]
  additionalGids: [4242]
  mounts:
    - hostPath: {d}/share
      containerPath: /opt/cdi
      options: [ro, bind]
  hooks:
    - hookName: createRuntime
      path: /bin/sh
      args: [sh, -c, "cat > {d}/createRuntime"]
    - hookName: createContainer
      path: /bin/sh
      args: [sh, -c, "cat > {d}/createContainer"]
      timeout: 10
    - hookName: startContainer
      path: /bin/sh
      args: [sh, -c, "cat > /tmp/startContainer; grep CapEff /proc/self/status > /tmp/startContainer.caps"]
    - hookName: poststart
      path: /bin/sh
      args: [sh, -c, "cat > {d}/poststart"]
    - hookName: poststop
      path: /bin/sh
      args: [sh, -c, "cat > {d}/poststop"]
"#
    )
}

fn mknod(path: &Path, major: u64, minor: u64) {
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(major, minor),
    )
    .unwrap();
}

async fn sh(env: &PodEnv, id: &str, script: &str) -> (String, String, i32) {
    env.exec(id, &["sh", "-c", script], 20).await.expect("exec")
}

fn cdi(names: &[&str], cfg: &mut cri::ContainerConfig) {
    cfg.cdi_devices = names
        .iter()
        .map(|n| cri::CdiDevice {
            name: n.to_string(),
        })
        .collect();
}

/// A hook's state, read from the file it wrote.
fn state(path: &Path) -> serde_json::Value {
    let t = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(v) = serde_json::from_str(&text)
        {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn cdi_spec_file_to_running_container() {
    let specs = tempfile::tempdir().unwrap();
    let (etc, run) = (specs.path().join("etc"), specs.path().join("run"));
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    let env = PodEnv::start_with(&format!(
        "[cdi]\nspec_dirs = [\"{}\", \"{}\"]\n",
        etc.display(),
        run.display()
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    mknod(&dir.path().join("fake0"), 1, 11);
    std::fs::create_dir(dir.path().join("share")).unwrap();
    std::fs::write(dir.path().join("share/driver.txt"), "from the vendor\n").unwrap();
    // The spec is written after the daemon started: it is read at the container that asks.
    std::fs::write(etc.join("crius-test.yaml"), spec_yaml(dir.path())).unwrap();

    let sb = env.sandbox_config("cdi");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("gpu", LONG);
    cdi(&["crius.test/dev=fake0"], &mut cfg);
    let c = env.run(&pod, &sb, cfg).await;

    let (out, err, code) = sh(
        &env,
        &c,
        "echo $CDI_VENDOR $CDI_DEVICE; ls -ln /dev/crius-fake0; cat /opt/cdi/driver.txt; \
         id -G; touch /opt/cdi/x 2>/dev/null || echo read-only",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "crius fake0", "{out}");
    assert!(
        lines[1].starts_with("crw") && lines[1].contains(" 1,") && lines[1].contains(" 11 "),
        "the node has the host node's numbers: {out}"
    );
    assert_eq!(lines[2], "from the vendor");
    assert!(lines[3].split(' ').any(|g| g == "4242"), "{out}");
    assert_eq!(lines[4], "read-only");
    // Exec'd commands get the spec's environment and groups too: both were in the first exec.

    // Hooks: each kind with its status; the monitor's get the host's pid of the container.
    let pid = env.d.container_info(&c).await["pid"].as_i64().unwrap();
    let runtime = state(&dir.path().join("createRuntime"));
    assert_eq!(runtime["status"], "creating");
    assert_eq!(runtime["id"], c.as_str());
    assert_eq!(runtime["pid"].as_i64(), Some(pid), "{runtime}");
    let created = state(&dir.path().join("createContainer"));
    assert_eq!(created["status"], "creating");
    assert_eq!(created["pid"].as_i64(), Some(pid), "{created}");
    let (out, _, _) = sh(&env, &c, "cat /tmp/startContainer").await;
    let started: serde_json::Value = serde_json::from_str(&out).expect("startContainer state");
    assert_eq!(started["status"], "created");
    // It ran with the container process's own capabilities, not the init's.
    let (hook_caps, _, _) = sh(&env, &c, "cat /tmp/startContainer.caps").await;
    let (caps, _, _) = sh(&env, &c, "grep CapEff /proc/1/status").await;
    assert_eq!(hook_caps, caps);
    assert!(caps.contains("00000000a80425fb"), "{caps}");
    assert_eq!(state(&dir.path().join("poststart"))["status"], "running");
    env.d
        .runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: c.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
    assert_eq!(state(&dir.path().join("poststop"))["status"], "stopped");

    // By annotation, as device plugins ask; a spec written into the later directory wins.
    std::fs::write(
        run.join("late.json"),
        r#"{"cdiVersion":"0.3.0","kind":"crius.test/dev","devices":[{"name":"fake0","containerEdits":{"env":["CDI_FROM=run"]}}]}"#,
    )
    .unwrap();
    let mut cfg = env.container_config("by-annotation", LONG);
    cfg.annotations = [(
        "cdi.k8s.io/crius-test".to_string(),
        "crius.test/dev=fake0".to_string(),
    )]
    .into();
    let c2 = env.run(&pod, &sb, cfg).await;
    let (out, err, code) = sh(&env, &c2, "echo $CDI_FROM $CDI_VENDOR; ls /dev").await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("run\n"),
        "only the winning file's edits: {out}"
    );
    assert!(!out.contains("crius-fake0"), "{out}");
    std::fs::remove_file(run.join("late.json")).unwrap();

    // Refusals name the request's field, the device and the file.
    let refused = |cfg: cri::ContainerConfig| {
        let env = &env;
        let (pod, sb) = (&pod, &sb);
        async move {
            let e = env.create(pod, sb, cfg).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
            e.message().to_string()
        }
    };
    let mut cfg = env.container_config("unknown", LONG);
    cdi(&["crius.test/dev=fake0", "crius.test/dev=nine"], &mut cfg);
    let m = refused(cfg).await;
    assert!(
        m.contains("config.cdi_devices[1].name") && m.contains("crius.test/dev=nine"),
        "{m}"
    );
    std::fs::write(
        run.join("broken.json"),
        r#"{"cdiVersion":"0.3.0","kind":"crius.test/broken","devices":[{"name":"x","containerEdits":{"colour":"red"}}]}"#,
    )
    .unwrap();
    let mut cfg = env.container_config("broken", LONG);
    cdi(&["crius.test/broken=x"], &mut cfg);
    let m = refused(cfg).await;
    assert!(m.contains("broken.json") && m.contains("colour"), "{m}");
    // `crius check` lists the devices and says what is wrong with the broken file.
    let out = env.d.cli(&[
        "check",
        "--config",
        &env.d.config.display().to_string(),
        "-o",
        "json",
    ]);
    let items: serde_json::Value = serde_json::from_slice(&out.stdout).expect("check's JSON");
    let cdi_items: Vec<&serde_json::Value> = items
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["item"] == "CDI")
        .collect();
    let text = serde_json::to_string(&cdi_items).unwrap();
    assert!(
        cdi_items.iter().any(|i| i["level"] == "warn")
            && text.contains("broken.json")
            && text.contains("crius.test/dev=fake0"),
        "{text}"
    );
    let mut cfg = env.container_config("malformed", LONG);
    cdi(&["fake0"], &mut cfg);
    assert!(refused(cfg).await.contains("config.cdi_devices[0].name"));
    std::fs::write(
        etc.join("again.json"),
        r#"{"cdiVersion":"0.3.0","kind":"crius.test/dev","devices":[{"name":"fake0"}]}"#,
    )
    .unwrap();
    let mut cfg = env.container_config("conflict", LONG);
    cdi(&["crius.test/dev=fake0"], &mut cfg);
    let m = refused(cfg).await;
    assert!(
        m.contains("again.json") && m.contains("crius-test.yaml"),
        "{m}"
    );
    std::fs::remove_file(etc.join("again.json")).unwrap();

    // A hook that fails fails the start, and says so.
    std::fs::write(
        run.join("failing.json"),
        r#"{"cdiVersion":"0.3.0","kind":"crius.test/failing","devices":[{"name":"x","containerEdits":{"hooks":[{"hookName":"createContainer","path":"/bin/sh","args":["sh","-c","echo no driver here >&2; exit 7"]}]}}]}"#,
    )
    .unwrap();
    let mut cfg = env.container_config("failing", LONG);
    cdi(&["crius.test/failing=x"], &mut cfg);
    let id = env.create(&pod, &sb, cfg).await.unwrap();
    let e = env.start_container(&id).await.unwrap_err();
    assert!(
        e.message().contains("createContainer hook") && e.message().contains("no driver here"),
        "{}",
        e.message()
    );
    // A monitor's hook that outlasts its timeout is killed, and fails the start too.
    std::fs::write(
        run.join("slow.json"),
        r#"{"cdiVersion":"0.3.0","kind":"crius.test/slow","devices":[{"name":"x","containerEdits":{"hooks":[{"hookName":"createRuntime","path":"/bin/sleep","args":["sleep","3600"],"timeout":1}]}}]}"#,
    )
    .unwrap();
    let mut cfg = env.container_config("slow", LONG);
    cdi(&["crius.test/slow=x"], &mut cfg);
    let id = env.create(&pod, &sb, cfg).await.unwrap();
    let e = env.start_container(&id).await.unwrap_err();
    assert!(
        e.message().contains("createRuntime hook") && e.message().contains("timed out after 1 s"),
        "{}",
        e.message()
    );
    let hung = std::process::Command::new("pgrep")
        .args(["-f", "sleep 3600"])
        .output()
        .unwrap();
    assert!(hung.stdout.is_empty(), "the hook was killed");
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn cdi_turned_off_refuses_devices() {
    let env = PodEnv::start_with("[cdi]\nenable = false\n").await;
    let sb = env.sandbox_config("nocdi");
    let pod = env.run_pod(&sb).await.unwrap();
    let mut cfg = env.container_config("gpu", LONG);
    cdi(&["crius.test/dev=fake0"], &mut cfg);
    let e = env.create(&pod, &sb, cfg).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("enable = false"), "{}", e.message());
    // Containers that ask for none are not touched.
    env.run(&pod, &sb, env.container_config("plain", LONG))
        .await;
    env.remove_pod(&pod).await;
}
