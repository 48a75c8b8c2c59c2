//! The pod agent end to end: manifests in a directory, a `crius agent` process driving a crius
//! daemon through CRI, images from the test registry; checked through the agent's records (what
//! `crius get pods` shows), container logs and files.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use crius::frontend::status::{self, Phase, PodRecord, State};

struct Agent {
    pub manifests: PathBuf,
    pub state: PathBuf,
    pub logs: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    config: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

fn bin() -> String {
    std::env::var("CRIUS_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_crius").to_string())
}

impl Agent {
    fn start(d: &Daemon) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("crius-agent")
            .tempdir()
            .unwrap();
        let mut a = Agent {
            manifests: dir.path().join("manifests"),
            state: dir.path().join("state"),
            logs: dir.path().join("logs"),
            socket: d.socket.clone(),
            log: dir.path().join("agent.log"),
            config: dir.path().join("config.toml"),
            child: None,
            _dir: dir,
        };
        std::fs::create_dir_all(&a.manifests).unwrap();
        std::fs::write(&a.config, "").unwrap();
        a.spawn();
        a
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(bin())
            .args(["agent", "--config"])
            .arg(&self.config)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--state")
            .arg(&self.state)
            .arg("--log-dir")
            .arg(&self.logs)
            .args(["--log-level", "info,crius=debug"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the agent");
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn put(&self, name: &str, yaml: &str) {
        // Written aside and renamed in, as an editor or `crius run` would.
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.manifests.join(name)).unwrap();
    }

    fn remove(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(name)).unwrap();
    }

    fn record(&self, name: &str) -> Option<PodRecord> {
        status::load_all(&self.state)
            .into_iter()
            .find(|r| r.name == name)
    }

    /// Waits until the pod's record satisfies `ok`; returns it.
    fn wait(
        &self,
        name: &str,
        what: &str,
        secs: u64,
        ok: impl Fn(&PodRecord) -> bool,
    ) -> PodRecord {
        let start = Instant::now();
        loop {
            if let Some(r) = self.record(name)
                && ok(&r)
            {
                return r;
            }
            if start.elapsed() > Duration::from_secs(secs) {
                panic!(
                    "pod {name}: {what} not within {secs}s\nrecord: {:#?}\nagent log:\n{}",
                    self.record(name),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin())
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .output()
            .unwrap()
    }

    /// A container's log lines (content only) of its `attempt`th run.
    fn log(&self, r: &PodRecord, container: &str, attempt: u32) -> Vec<String> {
        let p = self
            .logs
            .join(format!("{}_{}_{}", r.namespace, r.name, r.uid))
            .join(container)
            .join(format!("{attempt}.log"));
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(String::from))
            .collect()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn container<'a>(r: &'a PodRecord, name: &str) -> &'a status::ContainerRecord {
    r.all().find(|c| c.name == name).expect("container")
}

fn pod(name: &str, image: &str, restart: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart}\n  terminationGracePeriodSeconds: 2\n  containers:\n{}",
        containers.replace("IMAGE", image)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_policies_statuses_and_events() {
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let img = &env.image;
    a.put(
        "done.yaml",
        &pod(
            "done",
            img,
            "Never",
            "  - name: main\n    image: IMAGE\n    command: [sh, -c, 'echo hello; exit 0']\n",
        ),
    );
    a.put(
        "fail.yaml",
        &pod(
            "fail",
            img,
            "Never",
            "  - name: main\n    image: IMAGE\n    command: [sh, -c, 'exit 3']\n",
        ),
    );
    a.put(
        "crash.yaml",
        &pod(
            "crash",
            img,
            "OnFailure",
            "  - name: main\n    image: IMAGE\n    command: [sh, -c, 'echo try; exit 1']\n",
        ),
    );
    a.put(
        "run.yaml",
        &pod(
            "run",
            img,
            "Always",
            "  - name: main\n    image: IMAGE\n    command: [sleep, '100000']\n",
        ),
    );
    let done = a.wait("done", "Succeeded", 30, |r| r.phase == Phase::Succeeded);
    assert_eq!(done.display_status(), "Completed");
    assert_eq!(a.log(&done, "main", 0), vec!["hello"]);
    let reasons: Vec<&str> = done.events.iter().map(|e| e.reason.as_str()).collect();
    for want in ["Pulled", "Created", "Started"] {
        assert!(reasons.contains(&want), "{reasons:?}");
    }
    let fail = a.wait("fail", "Failed", 30, |r| r.phase == Phase::Failed);
    assert!(matches!(
        container(&fail, "main").state,
        State::Terminated { exit_code: 3, .. }
    ));
    assert_eq!(fail.display_status(), "Error");
    let run = a.wait("run", "Ready", 30, |r| r.condition("Ready"));
    assert_eq!(run.phase, Phase::Running);
    assert_eq!(run.ready_count(), (1, 1));
    // OnFailure: restarted at once, then after a 10 s back-off, in CrashLoopBackOff between.
    let crash = a.wait("crash", "a back-off", 40, |r| {
        matches!(&container(r, "main").state, State::Waiting { reason, .. } if reason == "CrashLoopBackOff")
    });
    assert!(container(&crash, "main").restart_count >= 1);
    assert_eq!(crash.display_status(), "CrashLoopBackOff");
    let crash = a.wait("crash", "the second restart", 40, |r| {
        container(r, "main").restart_count >= 2
    });
    assert!(crash.events.iter().any(|e| e.reason == "BackOff"));
    assert_eq!(a.log(&crash, "main", 1), vec!["try"]);
    // The client's view.
    let out = a.cli(&["get", "pods", "--state", a.state.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, status) in [("done", "Completed"), ("fail", "Error"), ("run", "Running")] {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains(status), "{line}");
    }
    assert!(
        text.lines().any(|l| l.contains("run") && l.contains("1/1")),
        "{text}"
    );
    let out = a.cli(&[
        "describe",
        "pod",
        "crash",
        "--state",
        a.state.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Restart Count:") && text.contains("BackOff"),
        "{text}"
    );
    // Removing a manifest stops and forgets its pod.
    let sandbox = run.sandbox.clone().unwrap();
    a.remove("run.yaml");
    let start = Instant::now();
    while a.record("run").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "run not removed:\n{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pods = env
        .d
        .runtime()
        .list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(
        !pods.iter().any(|p| p.id == sandbox),
        "the sandbox is removed"
    );
}
