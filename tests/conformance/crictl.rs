//! crictl smoke: upstream `crictl` (the newest release, `cri-tools` in
//! `hack/upstream.versions`; `CRICTL` names another) drives a pod's whole life against the daemon, the
//! way an operator would by hand: version and info, pull and inspect an image, run a pod,
//! create and start a container, list, exec (sync and streaming), logs, stats, then stop and
//! remove all, the image last. Every step's result and time is printed as a table; a failed
//! step fails the test with crictl's output.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub fn crictl() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CRICTL") {
        return Some(PathBuf::from(p));
    }
    crate::common::upstream::need("cri-tools", "crictl")
}

struct Smoke {
    bin: PathBuf,
    config: PathBuf,
    rows: Vec<(String, bool, f64)>,
    failure: Option<String>,
}

impl Smoke {
    /// Runs `crictl ARGS`; the step passes when crictl succeeds and `check` accepts its stdout.
    /// Returns stdout.
    fn step(&mut self, name: &str, args: &[&str], check: impl Fn(&str) -> bool) -> String {
        if self.failure.is_some() {
            return String::new();
        }
        let t = Instant::now();
        let out = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("running crictl");
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let ok = out.status.success() && check(&stdout);
        self.rows
            .push((name.to_string(), ok, t.elapsed().as_secs_f64()));
        if !ok {
            self.failure = Some(format!(
                "crictl {args:?}: {}\nstdout: {stdout}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        stdout
    }
}

/// The smoke run against the daemon on `socket`, with `image` in its registry; `work` holds the
/// configs and the pod's logs; `pod_ip` says whether the pod must get an IP (a CNI network).
pub fn smoke(socket: &Path, image: &str, work: &Path, pod_ip: bool) -> Result<(), String> {
    let Some(bin) = crictl() else {
        return Ok(());
    };
    let endpoint = format!("unix://{}", socket.display());
    let config = work.join("crictl-smoke.yaml");
    std::fs::write(
        &config,
        format!("runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\ntimeout: 30\n"),
    )
    .expect("crictl config");
    let logs = work.join("crictl-smoke-logs");
    std::fs::create_dir_all(&logs).expect("log directory");
    let pod_json = work.join("crictl-smoke-pod.json");
    std::fs::write(
        &pod_json,
        serde_json::json!({
            "metadata": {"name": "crictl-smoke", "namespace": "default", "uid": "crictl-smoke-uid"},
            "log_directory": logs,
            "linux": {}
        })
        .to_string(),
    )
    .expect("pod config");
    let ctr_json = work.join("crictl-smoke-ctr.json");
    std::fs::write(
        &ctr_json,
        serde_json::json!({
            "metadata": {"name": "smoke"},
            "image": {"image": image},
            "command": ["sh", "-c", "echo started; exec sleep 100000"],
            "log_path": "smoke.log",
            "linux": {}
        })
        .to_string(),
    )
    .expect("container config");
    let (pod_json, ctr_json) = (
        pod_json.display().to_string(),
        ctr_json.display().to_string(),
    );
    let mut s = Smoke {
        bin,
        config,
        rows: Vec::new(),
        failure: None,
    };
    s.step("version", &["version"], |o| {
        o.contains("RuntimeName:  crius")
    });
    s.step("info", &["info"], |o| {
        let v: serde_json::Value = serde_json::from_str(o).unwrap_or_default();
        v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "RuntimeReady" && c["status"] == true)
    });
    s.step("pull", &["pull", image], |o| {
        o.contains("Image is up to date")
    });
    let image_id = s.step("images", &["images", "-q", image], |o| !o.is_empty());
    s.step("inspecti", &["inspecti", image], |o| o.contains(&image_id));
    let pod = s.step("runp", &["runp", &pod_json], |o| o.len() == 64);
    s.step("pods", &["pods", "-q", "--name", "crictl-smoke"], |o| {
        o == pod
    });
    s.step("inspectp", &["inspectp", &pod], |o| {
        let v: serde_json::Value = serde_json::from_str(o).unwrap_or_default();
        let ready = v["status"]["state"] == "SANDBOX_READY";
        let ip = v["status"]["network"]["ip"].as_str().unwrap_or("");
        ready && (!pod_ip || !ip.is_empty())
    });
    let ctr = s.step("create", &["create", &pod, &ctr_json, &pod_json], |o| {
        o.len() == 64
    });
    s.step("start", &["start", &ctr], |o| o == ctr);
    s.step(
        "ps",
        &["ps", "-q", "--pod", &pod, "--state", "running"],
        |o| o == ctr,
    );
    s.step("exec -s", &["exec", "-s", &ctr, "echo", "sync"], |o| {
        o == "sync"
    });
    s.step("exec", &["exec", &ctr, "sh", "-c", "echo streamed"], |o| {
        o == "streamed"
    });
    s.step("logs", &["logs", &ctr], |o| o == "started");
    s.step("stats", &["stats", "-o", "json", &ctr], |o| {
        o.contains(&ctr)
    });
    s.step("statsp", &["statsp", "-o", "json", "--id", &pod], |o| {
        o.contains(&pod)
    });
    s.step("stop", &["stop", "--timeout", "0", &ctr], |o| o == ctr);
    s.step("rm", &["rm", &ctr], |o| o == ctr);
    s.step("stopp", &["stopp", &pod], |o| o.contains(&pod));
    s.step("rmp", &["rmp", &pod], |o| o.contains(&pod));
    s.step("rmi", &["rmi", image], |o| o.contains("Deleted"));
    s.step(
        "pods after",
        &["pods", "-q", "--name", "crictl-smoke"],
        |o| o.is_empty(),
    );

    println!("\n{:<8} {:>6}  crictl step", "result", "secs");
    for (name, ok, secs) in &s.rows {
        let label = if *ok { "passed" } else { "FAILED" };
        println!("{label:<8} {secs:>6.2}  {name}");
    }
    let passed = s.rows.iter().filter(|r| r.1).count();
    println!("\ncrictl smoke: {passed} of {} steps passed", s.rows.len());
    match s.failure {
        Some(f) => Err(format!("crictl smoke failed: {f}")),
        None => Ok(()),
    }
}
