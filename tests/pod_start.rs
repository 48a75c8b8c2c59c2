//! Pod start under an upstream kubelet, with its relisting PLEG and with its event-driven one
//! (EventedPLEG: GetContainerEvents): the time from a static pod's manifest appearing to
//! kubelet reporting the pod Running, for pods one after another on the network list crius
//! ships. A measurement for `cargo xtask bench` (printed as one `BENCH {json}` line), not a
//! pass/fail test: it runs only when asked (`CRIUS_BENCH_PODS`), in the VM, since kubelet
//! changes the machine it runs on.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::time::{Duration, Instant};

use common::kubelet::*;
use common::net::*;
use common::*;
use crius::cri::v1 as cri;

fn manifest(name: &str, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
    command: ["sleep", "100000"]
"#
    )
}

fn running(p: &serde_json::Value) -> bool {
    container_status(p, "main").is_some_and(|c| c["state"]["running"].is_object())
}

/// Starts `pods` pods one after another under a kubelet with `gates`; their start times in ms
/// (the first pod, which waits for the node to come up, is not counted).
async fn measure(env: &PodEnv, kubelet: &std::path::Path, gates: &str, pods: usize) -> Vec<f64> {
    let k = Kubelet::start(kubelet, &env.d.socket, "cgroupfs", gates);
    let mut times = Vec::new();
    for i in 0..=pods {
        let name = format!("start-{i}");
        let t = Instant::now();
        k.manifest(&name, &manifest(&name, &env.image));
        loop {
            if pod(&name).is_some_and(|p| running(&p)) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "{name} never ran\n{}",
                k.log_tail()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        if i > 0 {
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    if std::env::var_os("CRIUS_BENCH_DEBUG").is_some() {
        let log = std::fs::read_to_string(&k.log).unwrap_or_default();
        for l in log.lines().filter(|l| l.contains("start-1")) {
            eprintln!("kubelet: {l}");
        }
    }
    // Taken down by kubelet, then whatever sandbox it left is removed for the next kubelet.
    for i in 0..=pods {
        k.remove_manifest(&format!("start-{i}"));
    }
    let t = Instant::now();
    while (0..=pods).any(|i| pod(&format!("start-{i}")).is_some()) {
        assert!(t.elapsed() < Duration::from_secs(300), "{}", k.log_tail());
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(k);
    let mut rt = env.d.runtime();
    let all = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    for s in all {
        env.stop_pod(&s.id).await;
        env.remove_pod(&s.id).await;
    }
    times
}

#[tokio::test]
#[ignore = "a measurement for cargo xtask bench: kubelet in the VM"]
async fn pod_start_latency() {
    let Some(pods) = std::env::var("CRIUS_BENCH_PODS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    else {
        not_here("a measurement; cargo xtask bench sets CRIUS_BENCH_PODS");
        return;
    };
    let Some(kubelet) = kubelet("") else {
        return;
    };
    assert!(
        in_vm(),
        "kubelet changes the machine it runs on: run in the VM"
    );
    if !plugins_present() {
        return;
    }
    let _sysctls = Sysctls::save();
    let mut env = PodEnv::start_with(&format!(
        "{}[cgroup]\ndriver = \"cgroupfs\"\n",
        ShippedNet::TABLES
    ))
    .await;
    std::fs::write(
        env.d.net_dir().join("10-kubelet.conflist"),
        ShippedNet::LIST,
    )
    .unwrap();
    let relist = measure(&env, &kubelet, "", pods).await;
    let evented = measure(&env, &kubelet, "EventedPLEG=true", pods).await;
    println!(
        "BENCH {}",
        serde_json::json!({"relist_ms": relist, "evented_ms": evented})
    );
    env.d.stop();
}
