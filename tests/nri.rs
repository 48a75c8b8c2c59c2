//! NRI with crius's own test plugins (`hack/clients`: a logger, an ulimit adjuster and a device
//! injector on NRI's published stub, as upstream's samples are; the proxy does not serve those
//! samples' module): the logger sees a pod's life in order and its environment adjustment
//! reaches the container; the ulimit adjuster changes `ulimit -n`; the device injector puts a
//! device node and a mount into a container; a plugin that is killed or stopped (SIGSTOP)
//! leaves CRI calls working; a pre-installed plugin is started from the plugin directory with
//! its configuration, and killed when the daemon stops. critest main's NRI specs run in the
//! conformance tier (`tests/conformance.rs`).

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use crius::cri::v1 as cri;

const LONG: &[&str] = &["sleep", "100000"];

/// One of the NRI test plugins, copied into `dir` (a pre-installed plugin is started from a
/// directory of the test's own); None (after the skip line) when it is not built.
fn plugin(name: &str, dir: &Path) -> Option<PathBuf> {
    let built = upstream::need("clients", name)?;
    let bin = dir.join(name);
    std::fs::copy(&built, &bin).unwrap();
    Some(bin)
}

/// A plugin process, killed when the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a plugin on `socket`.
fn start_plugin(bin: &Path, socket: &Path, idx: &str, args: &[&str], log: &Path) -> Running {
    let out = std::fs::File::create(log).unwrap();
    Running(
        Command::new(bin)
            .arg("-idx")
            .arg(idx)
            .arg("-socket-path")
            .arg(socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap(),
    )
}

/// Waits until `path` contains `what`; returns its text.
fn wait_for(path: &Path, what: &str) -> String {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{} never said {what:?}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The events the logger logged, each once, in the order first seen (`msg="Event: tag:"`).
fn events(log: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in log.lines() {
        let Some(msg) = line.split("msg=\"").nth(1) else {
            continue;
        };
        let Some((event, rest)) = msg.split_once(": ") else {
            continue;
        };
        if rest.ends_with(":\"") && !rest.starts_with(' ') && !out.iter().any(|e| e == event) {
            out.push(event.to_string());
        }
    }
    out
}

async fn stop_container(env: &PodEnv, id: &str) {
    env.d
        .runtime()
        .stop_container(cri::StopContainerRequest {
            container_id: id.into(),
            timeout: 0,
        })
        .await
        .unwrap();
}

async fn remove_container(env: &PodEnv, id: &str) {
    env.d
        .runtime()
        .remove_container(cri::RemoveContainerRequest {
            container_id: id.into(),
        })
        .await
        .unwrap();
}

/// A pod with one container that runs `cmd`, through to its removal.
async fn pod_life(env: &PodEnv, name: &str, cmd: &[&str]) -> (String, String) {
    let sb = env.sandbox_config(name);
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("c1", cmd)).await;
    (pod, c)
}

#[tokio::test]
async fn logger_sees_a_pods_life_in_order_and_dead_plugins_block_nothing() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let Some(logger) = plugin("nri-logger", dir.path()) else {
        return;
    };
    let env = PodEnv::start().await;
    let socket = env.d.nri_socket();
    let log = dir.path().join("logger.log");
    let mut plugin = start_plugin(
        &logger,
        &socket,
        "10",
        &[
            "-set-env",
            "NRI_LOGGER",
            "-log-file",
            &log.display().to_string(),
        ],
        &dir.path().join("logger.out"),
    );
    wait_for(&log, "Synchronize");

    let (pod, c) = pod_life(&env, "logged", LONG).await;
    // The logger's adjustment reached the container's environment.
    let (out, _, _) = env
        .exec(&c, &["sh", "-c", "echo $NRI_LOGGER"], 10)
        .await
        .unwrap();
    assert!(out.starts_with("logger-pid-"), "{out:?}");
    stop_container(&env, &c).await;
    remove_container(&env, &c).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    let text = wait_for(&log, "RemovePodSandbox");
    let seen = events(&text);
    let want = [
        "Synchronize",
        "RunPodSandbox",
        "CreateContainer",
        // The logger validates too: after every plugin's adjustment is merged.
        "ValidateContainerAdjustment",
        "PostCreateContainer",
        "StartContainer",
        "PostStartContainer",
        "StopContainer",
        "RemoveContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ];
    assert_eq!(seen, want, "{text}");
    // Told once each: stopping again, and the exit the monitor saw, tell nothing more.
    assert_eq!(
        text.matches("msg=\"StopContainer: pod:\"").count(),
        1,
        "{text}"
    );

    // A container that exits on its own is reported stopped without being asked to stop.
    let (pod, c) = pod_life(&env, "exits", &["sh", "-c", "exit 3"]).await;
    env.wait_exit(&c, Duration::from_secs(20)).await;
    let t = Instant::now();
    while std::fs::read_to_string(&log)
        .unwrap()
        .matches("msg=\"StopContainer: pod:\"")
        .count()
        < 2
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no StopContainer for the exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;

    // A plugin that stops answering (SIGSTOP) costs one request timeout, then is dropped.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(plugin.0.id() as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let t = Instant::now();
    let (pod, c) = pod_life(&env, "stopped-plugin", LONG).await;
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    let _ = c;
    // A killed plugin: nothing waits on it at all.
    let _ = plugin.0.kill();
    let _ = plugin.0.wait();
    let t = Instant::now();
    let (pod, _) = pod_life(&env, "killed-plugin", LONG).await;
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[tokio::test]
async fn ulimit_adjuster_sets_open_files() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = plugin("nri-ulimit-adjuster", dir.path()) else {
        return;
    };
    let env = PodEnv::start().await;
    let _plugin = start_plugin(
        &bin,
        &env.d.nri_socket(),
        "20",
        &[],
        &dir.path().join("ulimit.out"),
    );
    // The plugin is listed once a pod's events reach it: wait for a pod to be seen.
    wait_plugins(&env, 1).await;
    let mut sb = env.sandbox_config("ulimits");
    sb.annotations = [(
        "ulimits.noderesource.dev/container.c1".to_string(),
        "- type: RLIMIT_NOFILE\n  soft: 1234\n  hard: 2345\n".to_string(),
    )]
    .into();
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("c1", LONG)).await;
    let (out, err, code) = env
        .exec(&c, &["sh", "-c", "ulimit -Sn; ulimit -Hn"], 10)
        .await
        .unwrap();
    assert_eq!((out.as_str(), code), ("1234\n2345\n", 0), "{err}");

    // A second adjuster claims the same rlimit: the create is refused, naming both.
    let _second = start_plugin(
        &bin,
        &env.d.nri_socket(),
        "21",
        &[],
        &dir.path().join("ulimit2.out"),
    );
    wait_plugins(&env, 2).await;
    let mut again = env.container_config("c1", LONG);
    again.metadata.as_mut().unwrap().attempt = 1;
    let e = env.create(&pod, &sb, again).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(
            "plugins \"20-nri-ulimit-adjuster\" and \"21-nri-ulimit-adjuster\" both tried to set Rlimits RLIMIT_NOFILE"
        ),
        "{}",
        e.message()
    );
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

#[tokio::test]
async fn device_injector_puts_a_device_node_and_a_mount_in() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = plugin("nri-device-injector", dir.path()) else {
        return;
    };
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(share.join("hello.txt"), "from the injector\n").unwrap();
    let env = PodEnv::start().await;
    let _plugin = start_plugin(
        &bin,
        &env.d.nri_socket(),
        "30",
        &[],
        &dir.path().join("injector.out"),
    );
    wait_plugins(&env, 1).await;
    let mut sb = env.sandbox_config("devices");
    sb.annotations = [
        (
            "devices.noderesource.dev/container.c1".to_string(),
            "- path: /dev/nri-fake0\n  type: c\n  major: 1\n  minor: 11\n  file_mode: 0600\n"
                .to_string(),
        ),
        (
            "mounts.noderesource.dev/container.c1".to_string(),
            format!(
                "- source: {}\n  destination: /mnt/injected\n  type: bind\n  options: [bind, ro]\n",
                share.display()
            ),
        ),
    ]
    .into();
    let pod = env.run_pod(&sb).await.unwrap();
    let c = env.run(&pod, &sb, env.container_config("c1", LONG)).await;
    let (out, err, code) = env
        .exec(
            &c,
            &[
                "sh",
                "-c",
                "ls -l /dev/nri-fake0; cat /mnt/injected/hello.txt; touch /mnt/injected/x 2>/dev/null || echo read-only",
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("crw-------") && lines[0].contains(" 1,") && lines[0].contains(" 11 "),
        "{out}"
    );
    assert_eq!(&lines[1..], ["from the injector", "read-only"], "{out}");
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
}

/// Waits until some plugin is taken on: a pod run meanwhile is seen by it (the daemon says
/// so in its log).
async fn wait_plugins(env: &PodEnv, count: usize) {
    let t = Instant::now();
    while env.d.log_text().matches("NRI plugin connected").count() < count {
        assert!(t.elapsed() < Duration::from_secs(20), "no plugin connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn pre_installed_plugins_start_with_their_config_and_end_with_the_daemon() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let conf = dir.path().join("conf.d");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    let Some(logger) = plugin("nri-logger", &plugins) else {
        return;
    };
    std::fs::rename(&logger, plugins.join("10-logger")).unwrap();
    // Not an IDX-NAME file: left alone.
    std::fs::write(plugins.join("README"), "not a plugin").unwrap();
    let log = dir.path().join("pre.log");
    std::fs::write(
        conf.join("10-logger.conf"),
        format!(
            "logFile: {}\nevents: [RunPodSandbox, StopPodSandbox]\n",
            log.display()
        ),
    )
    .unwrap();
    let mut env = PodEnv::start_with(&format!(
        "[nri]\nsocket_path = \"{{NRI_DIR}}/nri.sock\"\nplugin_path = \"{}\"\nplugin_config_path = \"{}\"\n",
        plugins.display(),
        conf.display()
    ))
    .await;
    wait_plugins(&env, 1).await;
    let sb = env.sandbox_config("pre");
    let pod = env.run_pod(&sb).await.unwrap();
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    let text = wait_for(&log, "StopPodSandbox");
    assert_eq!(
        events(&text),
        ["Synchronize", "RunPodSandbox", "StopPodSandbox"],
        "{text}"
    );
    let pid = plugin_pid(&plugins.join("10-logger")).expect("the plugin runs");
    env.d.stop();
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "plugin {pid} outlived the daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process running `exe`, if one does.
fn plugin_pid(exe: &Path) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        (std::fs::read_link(e.path().join("exe")).ok()? == exe).then_some(pid)
    })
}
