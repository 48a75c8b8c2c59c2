//! Pod networking through the real CNI plugins (Debian's containernetworking-plugins): pod IPs
//! on a bridge of the test's own (no masquerade, no route out), pods and the host reaching pods
//! by IP, hostPort through the portmap plugin, NetworkReady following the configuration
//! directory, clear errors from broken lists and missing plugins, and nothing left behind: no
//! veth, no IPAM allocation, no iptables rule, not after many cycles nor after the daemon is
//! killed in the middle of an ADD.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::net::*;
use common::*;
use crius::cri::v1 as cri;

const LONG: &[&str] = &["sleep", "100000"];

/// Namespace handles (nsfs mounts) under the daemon's directories.
fn nsfs_mounts(env: &PodEnv) -> usize {
    let dir = env.d.dir.path().to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(" - nsfs ") && l.contains(&dir))
        .count()
}

/// Tests here count host-wide things (links, iptables rules): one at a time.
static HOST: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The host, held for one test, and a bridge network of the test's own; none (after a skip
/// line) where the CNI plugins are not installed.
async fn host_net() -> Option<(tokio::sync::MutexGuard<'static, ()>, TestNet)> {
    if !plugins_present() {
        return None;
    }
    let host = HOST.lock().await;
    Some((host, TestNet::new()))
}

fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

fn web_server(env: &PodEnv, name: &str) -> cri::ContainerConfig {
    env.container_config(
        name,
        &[
            "sh",
            "-c",
            "mkdir -p /www && echo hello from $(hostname) > /www/index.html && exec httpd -f -p 80 -h /www",
        ],
    )
}

async fn pod_ip(env: &PodEnv, pod: &str) -> String {
    env.d
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod.into(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap()
        .network
        .map(|n| n.ip)
        .unwrap_or_default()
}

async fn network_ready(env: &PodEnv) -> cri::RuntimeCondition {
    env.d
        .runtime()
        .status(cri::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == "NetworkReady")
        .unwrap()
}

/// Waits until `addr` answers with `want` in the body.
async fn wait_http(addr: &str, want: &str) -> String {
    let start = Instant::now();
    loop {
        if let Ok(t) = http_get(addr, "/index.html")
            && t.contains(want)
        {
            return t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{addr} never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two pods reach each other by IP, the host reaches them, hostPort answers on loopback and on
/// the node's address, the IP is in PodSandboxStatus and survives a daemon restart, a
/// host-network pod gets no attachment, NetworkReady follows the directory; afterwards nothing
/// of it is left.
#[tokio::test]
async fn pods_get_ips_and_reach_each_other() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let rules_before = iptables_rules();
    let mut env = PodEnv::start_with(&net.tables()).await;
    assert!(!network_ready(&env).await.status);
    std::fs::write(
        env.d.net_dir().join("10-test.conflist"),
        net.conflist(TestNet::portmap()),
    )
    .unwrap();
    // Read again without a restart.
    let start = Instant::now();
    while !network_ready(&env).await.status {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "NetworkReady stayed false"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let sa = env.sandbox_config("web-a");
    let a = env.run_pod(&sa).await.unwrap();
    env.run(&a, &sa, web_server(&env, "httpd")).await;
    let ip_a = pod_ip(&env, &a).await;
    assert!(ip_a.starts_with(&format!("{}.", net.prefix)), "{ip_a}");
    // The host reaches the pod by its IP.
    let page = wait_http(&format!("{ip_a}:80"), "hello from web-a").await;
    assert!(page.starts_with("HTTP/1."), "{page}");

    // Another pod reaches it by IP too, and its own IP differs.
    let port = free_port();
    let mut sb = env.sandbox_config("web-b");
    sb.port_mappings = vec![cri::PortMapping {
        protocol: cri::Protocol::Tcp as i32,
        container_port: 80,
        host_port: port as i32,
        host_ip: String::new(),
    }];
    let b = env.run_pod(&sb).await.unwrap();
    let cb = env.run(&b, &sb, web_server(&env, "httpd")).await;
    let ip_b = pod_ip(&env, &b).await;
    assert_ne!(ip_a, ip_b);
    let (out, _, code) = env
        .exec(&cb, &["wget", "-q", "-O-", &format!("http://{ip_a}/")], 20)
        .await
        .unwrap();
    assert_eq!((out.trim(), code), ("hello from web-a", 0));
    // hostPort: on loopback and on the node's own address.
    wait_http(&format!("127.0.0.1:{port}"), "hello from web-b").await;
    match node_address() {
        Some(addr) => {
            wait_http(&format!("{addr}:{port}"), "hello from web-b").await;
        }
        None => println!("no address but loopback on this node: the node-address check is skipped"),
    }

    // A host-network pod sees the host's interfaces and gets no attachment.
    let mut sh = env.sandbox_config("hostnet");
    namespace_options(&mut sh).network = cri::NamespaceMode::Node as i32;
    let h = env.run_pod(&sh).await.unwrap();
    assert_eq!(pod_ip(&env, &h).await, "");
    let ch = env.run(&h, &sh, env.container_config("c", LONG)).await;
    let (links, _, _) = env.exec(&ch, &["ip", "-o", "link"], 10).await.unwrap();
    assert!(links.contains(&net.bridge), "{links}");

    // The IP is state: the same after a restart, and inspectp shows the attachment.
    env.d.kill9();
    env.d.spawn();
    assert_eq!(pod_ip(&env, &a).await, ip_a);
    let verbose = env
        .d
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: a.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        verbose.info["network"].contains(&ip_a),
        "{:?}",
        verbose.info
    );
    assert_eq!(
        verbose.info.get("networkCheck").map(String::as_str),
        Some("ok"),
        "{:?}",
        verbose.info
    );
    // CHECK notices a pod whose address was taken away behind the runtime's back.
    let status_b = |verbose| {
        let mut rt = env.d.runtime();
        let b = b.clone();
        async move {
            rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: b,
                verbose,
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let netns_b = env.d.pod_info(&b).await["namespaces"]["net"]
        .as_str()
        .unwrap()
        .to_string();
    let flushed = std::process::Command::new("nsenter")
        .arg(format!("--net={netns_b}"))
        .args(["ip", "addr", "flush", "dev", "eth0"])
        .status()
        .unwrap();
    assert!(flushed.success());
    let broken = status_b(true).await.info;
    assert!(
        broken.get("networkCheck").is_some_and(|c| c != "ok"),
        "{broken:?}"
    );
    // The client shows it beside the runtime's own info.
    let out = env.d.cli(&["inspectp", &a]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        shown["info"]["network"].to_string().contains(&ip_a),
        "{shown}"
    );
    assert!(shown["info"]["namespaces"]["net"].is_string(), "{shown}");

    for pod in [&a, &b, &h] {
        env.remove_pod(pod).await;
    }
    assert_eq!(net.veths(), 0);
    assert_eq!(net.allocations(), Vec::<String>::new());
    assert_eq!(pod_rules(&rules_before), Vec::<String>::new());
}

/// 100 pods made and removed, then a daemon killed in the middle of an ADD: no veth, no IPAM
/// allocation, no iptables rule is left, and the half-made pod is stopped at restart.
#[tokio::test]
async fn nothing_leaks_over_cycles_and_a_kill_mid_add() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let rules_before = iptables_rules();
    // A plugin that takes its time before the real portmap: the daemon is killed meanwhile.
    let plugin_dir = plugins().display().to_string();
    script_plugin(
        &net,
        "slow-portmap",
        &format!("sleep 3\nexec {plugin_dir}/portmap\n"),
    );
    let mut env = PodEnv::start_with(&net.tables()).await;
    let list = env.d.net_dir().join("10-test.conflist");
    std::fs::write(&list, net.conflist(TestNet::portmap())).unwrap();
    let nsfs_before = nsfs_mounts(&env);
    assert_eq!(nsfs_before, 0);
    for i in 0..100 {
        let mut sb = env.sandbox_config(&format!("cycle-{i}"));
        sb.port_mappings = vec![cri::PortMapping {
            protocol: cri::Protocol::Tcp as i32,
            container_port: 80,
            host_port: 20000 + i,
            host_ip: String::new(),
        }];
        let pod = env.run_pod(&sb).await.unwrap();
        assert!(!pod_ip(&env, &pod).await.is_empty());
        if i == 0 {
            assert!(
                nsfs_mounts(&env) > 0,
                "the pod's namespaces are bound under the state dir"
            );
        }
        env.remove_pod(&pod).await;
    }
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
    assert_eq!(pod_rules(&rules_before), Vec::<String>::new());
    // Nor a namespace bind mount.
    assert_eq!(nsfs_mounts(&env), nsfs_before);

    std::fs::write(
        &list,
        net.conflist(r#",{"type":"slow-portmap","capabilities":{"portMappings":true}}"#),
    )
    .unwrap();
    // The list is read again after its change.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let sb = env.sandbox_config("killed-mid-add");
    let runtime = env.d.runtime();
    let adding = tokio::spawn(async move {
        let mut rt = runtime;
        rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb),
            runtime_handler: String::new(),
        })
        .await
    });
    // The bridge plugin has made the veth when the slow one starts.
    let start = Instant::now();
    while net.veths() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no veth appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.d.kill9();
    assert!(adding.await.unwrap().is_err());
    std::fs::write(&list, net.conflist(TestNet::portmap())).unwrap();
    env.d.spawn();
    // The restart undid the ADD: veth and IP are gone, the pod is not ready.
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
    let pods = env
        .d
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    for p in &pods {
        assert_eq!(
            p.state,
            cri::PodSandboxState::SandboxNotready as i32,
            "{p:?}"
        );
        env.remove_pod(&p.id).await;
    }
    assert_eq!(pod_rules(&rules_before), Vec::<String>::new());
}

/// Pods start side by side with the firewall plugin in the list: the first ADD runs alone
/// (the plugin makes its chains then, racily), the rest together; an ADD that loses a race
/// later ("File exists", as the plugin's chain creation says it) is undone and run again alone.
/// Every pod gets its IP and nothing is left once they are gone.
#[tokio::test]
async fn pods_start_side_by_side_with_the_firewall_plugin() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let rules_before = iptables_rules();
    let marks = tempfile::tempdir().unwrap();
    let m = marks.path().display();
    // The real firewall plugin, but the first ADD after one went through fails as a lost race.
    let plugin_dir = plugins().display().to_string();
    script_plugin(
        &net,
        "racy-firewall",
        &format!(
            "if [ \"$CNI_COMMAND\" = ADD ] && [ -e {m}/warm ] && mkdir {m}/raced 2>/dev/null; then\n\
             cat >/dev/null\n\
             echo '{{\"cniVersion\":\"1.0.0\",\"code\":999,\"msg\":\"CHAIN_USER_ADD failed (File exists)\"}}'\n\
             exit 1\nfi\n\
             [ \"$CNI_COMMAND\" = ADD ] && touch {m}/warm\n\
             exec {plugin_dir}/firewall\n"
        ),
    );
    let env = PodEnv::start_with(&net.tables()).await;
    std::fs::write(
        env.d.net_dir().join("10-test.conflist"),
        net.conflist(&format!(
            "{},{{\"type\":\"racy-firewall\"}}",
            TestNet::portmap()
        )),
    )
    .unwrap();
    let runs = (0..8).map(|i| {
        let sb = env.sandbox_config(&format!("side-{i}"));
        let env = &env;
        async move { env.run_pod(&sb).await }
    });
    let pods: Vec<String> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.expect("every pod starts"))
        .collect();
    assert!(marks.path().join("raced").exists(), "one ADD lost its race");
    let mut ips = Vec::new();
    for p in &pods {
        ips.push(pod_ip(&env, p).await);
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), pods.len(), "{ips:?}");
    assert!(
        env.d.log_text().contains("again, alone"),
        "the lost race was run again"
    );
    for p in &pods {
        env.remove_pod(p).await;
    }
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
    assert_eq!(pod_rules(&rules_before), Vec::<String>::new());
}

/// A broken list and a missing plugin: RunPodSandbox fails naming the file or the plugin, and
/// leaves no pod, veth or allocation.
#[tokio::test]
async fn broken_lists_and_missing_plugins_are_named() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let env = PodEnv::start_with(&net.tables()).await;
    let list = env.d.net_dir().join("10-test.conflist");
    std::fs::write(&list, "{ not json").unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let ready = network_ready(&env).await;
    assert!(
        !ready.status && ready.message.contains("10-test.conflist"),
        "{ready:?}"
    );
    let err = env
        .run_pod(&env.sandbox_config("broken"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("10-test.conflist"), "{err:?}");

    std::fs::write(&list, net.conflist(r#",{"type":"no-such-plugin"}"#)).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let err = env
        .run_pod(&env.sandbox_config("missing"))
        .await
        .unwrap_err();
    assert!(err.message().contains("no-such-plugin"), "{err:?}");
    let pods = env
        .d
        .runtime()
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(pods.is_empty(), "{pods:?}");
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
}

/// StopPodSandbox and RemovePodSandbox whose client gives up mid-teardown (a deadline shorter
/// than the DEL): the teardown still runs to its end with no further call, leaving no veth,
/// allocation or hostPort rule, and the calls made again answer OK.
#[tokio::test]
async fn a_teardown_its_client_gave_up_on_still_finishes() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let rules_before = iptables_rules();
    let plugin_dir = plugins().display().to_string();
    script_plugin(
        &net,
        "slow-portmap",
        &format!("[ \"$CNI_COMMAND\" = DEL ] && sleep 1\nexec {plugin_dir}/portmap\n"),
    );
    let env = PodEnv::start_with(&net.tables()).await;
    std::fs::write(
        env.d.net_dir().join("10-test.conflist"),
        net.conflist(r#",{"type":"slow-portmap","capabilities":{"portMappings":true}}"#),
    )
    .unwrap();
    for (round, remove) in [(0, false), (1, true)] {
        let mut sb = env.sandbox_config(&format!("cut-{round}"));
        sb.port_mappings = vec![cri::PortMapping {
            protocol: cri::Protocol::Tcp as i32,
            container_port: 80,
            host_port: 21000 + round,
            host_ip: String::new(),
        }];
        let pod = env.run_pod(&sb).await.unwrap();
        assert!(!pod_ip(&env, &pod).await.is_empty());
        assert!(!pod_rules(&rules_before).is_empty());
        let mut rt = env.d.runtime();
        let cut = if remove {
            let mut req = tonic::Request::new(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            });
            req.set_timeout(Duration::from_millis(50));
            rt.remove_pod_sandbox(req).await.map(drop)
        } else {
            let mut req = tonic::Request::new(cri::StopPodSandboxRequest {
                pod_sandbox_id: pod.clone(),
            });
            req.set_timeout(Duration::from_millis(50));
            rt.stop_pod_sandbox(req).await.map(drop)
        };
        // The server's deadline or the client's own timer, whichever fires first.
        let code = cut.unwrap_err().code();
        assert!(
            matches!(code, tonic::Code::DeadlineExceeded | tonic::Code::Cancelled),
            "the DEL takes a second: {code:?}"
        );
        let t = Instant::now();
        while net.veths() + net.allocations().len() > 0 || !pod_rules(&rules_before).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "round {round}: the teardown stopped with its call: {} veths, {:?}, {:?}",
                net.veths(),
                net.allocations(),
                pod_rules(&rules_before)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        env.remove_pod(&pod).await;
    }
}

/// Makes `name` in the test's plugin directory: a shell script.
fn script_plugin(net: &TestNet, name: &str, body: &str) {
    let path = net.bin.path().join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

async fn verbose_info(env: &PodEnv, pod: &str) -> std::collections::HashMap<String, String> {
    env.d
        .runtime()
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod.into(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info
}

/// DEL uses what ADD used: a list changed (even broken) after ADD does not matter, the stored
/// one tears the pod down. A DEL that fails leaves the pod's record, and StopPodSandbox names
/// the failure; the next stop tries again and frees everything.
#[tokio::test]
async fn del_uses_the_recorded_list_and_is_retried() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let rules_before = iptables_rules();
    // portmap, except that DEL fails while the marker exists (a fault the real plugin cannot
    // be made to produce).
    let marker = net.bin.path().join("fail-del");
    let plugin_dir = plugins().display().to_string();
    script_plugin(
        &net,
        "flaky-portmap",
        &format!(
            "if [ \"$CNI_COMMAND\" = DEL ] && [ -e {} ]; then\n\
             echo '{{\"code\":11,\"msg\":\"flaky DEL\"}}'; exit 1\nfi\nexec {plugin_dir}/portmap\n",
            marker.display()
        ),
    );
    let env = PodEnv::start_with(&net.tables()).await;
    let list = env.d.net_dir().join("10-test.conflist");
    std::fs::write(
        &list,
        net.conflist(r#",{"type":"flaky-portmap","capabilities":{"portMappings":true}}"#),
    )
    .unwrap();
    let sb = env.sandbox_config("flaky");
    let pod = env.run_pod(&sb).await.unwrap();
    assert!(!pod_ip(&env, &pod).await.is_empty());
    // Another list takes the directory's first place: one whose plugin does not exist.
    std::fs::write(
        env.d.net_dir().join("00-other.conflist"),
        r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"no-such-plugin"}]}"#,
    )
    .unwrap();
    std::fs::write(&marker, "").unwrap();
    let err = env
        .d
        .runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("flaky DEL"), "{err:?}");
    assert!(
        verbose_info(&env, &pod).await["network"].contains("flaky-portmap"),
        "the attachment record must stay for the retry"
    );
    std::fs::remove_file(&marker).unwrap();
    env.d
        .runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
    env.remove_pod(&pod).await;
    assert_eq!(pod_rules(&rules_before), Vec::<String>::new());
}

/// A CNI 0.2.0 list (results with `ip4`, no CHECK, DEL without the ADD result): the pod's IP
/// is reported, CHECK is skipped with the reason, and DEL frees the address.
#[tokio::test]
async fn pre_0_3_results_give_the_pod_ip() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let env = PodEnv::start_with(&net.tables()).await;
    let list = net.conflist("").replace("\"1.0.0\"", "\"0.2.0\"");
    assert!(list.contains("0.2.0"), "{list}");
    std::fs::write(env.d.net_dir().join("10-old.conflist"), list).unwrap();
    let sb = env.sandbox_config("old");
    let pod = env.run_pod(&sb).await.unwrap();
    let ip = pod_ip(&env, &pod).await;
    assert!(ip.starts_with(&net.prefix), "{ip:?}");
    let info = verbose_info(&env, &pod).await;
    assert!(info["network"].contains("ip4"), "{info:?}");
    assert_eq!(
        info.get("networkCheck").map(String::as_str),
        Some("not checked: CHECK is not in CNI versions before 0.4.0")
    );
    env.remove_pod(&pod).await;
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
}

/// A daemon killed after a pod's sandbox was recorded but before its network ADD began (shown
/// here by setting the pod's attachment record aside while the daemon is down: no fault in the
/// real flow stops there) leaves no pod that looks ready without its network: at start the pod
/// is stopped, so kubelet makes a new one.
#[tokio::test]
async fn a_pod_cut_short_before_its_add_is_not_left_ready() {
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let mut env = PodEnv::start_with(&net.tables()).await;
    std::fs::write(env.d.net_dir().join("10-test.conflist"), net.conflist("")).unwrap();
    let pod = env.run_pod(&env.sandbox_config("cut")).await.unwrap();
    assert!(!pod_ip(&env, &pod).await.is_empty());
    let record = env
        .d
        .state
        .join("sandboxes")
        .join(&pod)
        .join("network.json");
    let aside = record.with_extension("aside");
    env.d.kill9();
    std::fs::rename(&record, &aside).unwrap();
    env.d.spawn();
    let state = |env: &PodEnv| {
        let pod = pod.clone();
        let mut rt = env.d.runtime();
        async move {
            rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: pod,
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap()
            .state
        }
    };
    assert_eq!(
        state(&env).await,
        cri::PodSandboxState::SandboxNotready as i32
    );
    // The record back (the ADD did happen here): removing the pod frees its address.
    env.d.kill9();
    std::fs::rename(&aside, &record).unwrap();
    env.d.spawn();
    env.remove_pod(&pod).await;
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
}

/// An address host-local holds in the test network's data directory for an attachment crius never made,
/// as a reboot leaves them (the records are on `/run`, host-local's files are not): host-local
/// run alone, as its bridge would run it, in `netns` (not the caller's own, which plugins
/// refuse; host-local does nothing in it). The address.
fn stray_allocation(list: &str, id: &str, netns: &str) -> String {
    use std::io::Write as _;
    let list: serde_json::Value = serde_json::from_str(list).unwrap();
    let mut conf = list["plugins"][0].clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    let mut child = std::process::Command::new(plugins().join("host-local"))
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", plugins())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ip = result["ips"][0]["address"].as_str().unwrap();
    ip.split('/').next().unwrap().to_string()
}

/// Whether host-local holds `ip` in `net`'s data directory.
fn holds(net: &TestNet, ip: &str) -> bool {
    net.allocations()
        .iter()
        .any(|a| a.rsplit('/').next() == Some(ip))
}

/// CNI 1.1 (the newest plugins): NetworkReady follows the plugins' STATUS answers, and at start
/// GC hands them the attachments crius holds, so an address host-local kept for an attachment
/// crius has no record of goes while a running pod's stays. A list of an earlier version gets
/// neither verb.
#[tokio::test]
async fn cni_1_1_status_and_gc() {
    if debian_plugins() {
        not_here("CNI 1.1's STATUS and GC: Debian's 1.1.1 plugins do not know them");
        return;
    }
    let Some((_host, net)) = host_net().await else {
        return;
    };
    let list = net
        .conflist("")
        .replace(r#""cniVersion":"1.0.0""#, r#""cniVersion":"1.1.0""#);
    assert!(list.contains(r#""cniVersion":"1.1.0""#), "{list}");
    let mut env = PodEnv::start_with(&net.tables()).await;
    let file = env.d.net_dir().join("10-test.conflist");
    std::fs::write(&file, &list).unwrap();
    assert!(network_ready(&env).await.status);
    let sb = env.sandbox_config("kept");
    let pod = env.run_pod(&sb).await.unwrap();
    let kept = pod_ip(&env, &pod).await;
    assert!(!kept.is_empty());
    let info = env.d.pod_info(&pod).await;
    let netns = info["netNamespacePath"].as_str().unwrap().to_string();

    // A plugin that answers STATUS with the spec's "not available" error: not ready, named.
    let plugin_dir = plugins().display().to_string();
    script_plugin(
        &net,
        "picky-bridge",
        &format!(
            "if [ \"$CNI_COMMAND\" = STATUS ]; then\n\
             echo '{{\"cniVersion\":\"1.1.0\",\"code\":50,\"msg\":\"no uplink yet\"}}'; exit 1\nfi\n\
             exec {plugin_dir}/bridge\n"
        ),
    );
    std::fs::write(
        &file,
        list.replace(r#""type":"bridge""#, r#""type":"picky-bridge""#),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ready = network_ready(&env).await;
    assert!(!ready.status, "{ready:?}");
    assert_eq!(ready.reason, "NetworkPluginNotReady");
    assert!(ready.message.contains("no uplink yet"), "{ready:?}");
    std::fs::write(&file, &list).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(network_ready(&env).await.status);

    // An address no record owns, then a daemon start: GC drops it, keeps the pod's.
    let stray = stray_allocation(&list, "a-pod-a-reboot-forgot", &netns);
    assert!(holds(&net, &stray));
    env.d.restart();
    let t = Instant::now();
    while holds(&net, &stray) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "GC left {stray}: {:?}",
            net.allocations()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        holds(&net, &kept),
        "GC dropped the running pod's {kept}: {:?}",
        net.allocations()
    );
    assert_eq!(pod_ip(&env, &pod).await, kept);

    // A 1.0.0 list: no GC, so a stray address stays (the plugins would refuse the verb).
    std::fs::write(&file, net.conflist("")).unwrap();
    let stray = stray_allocation(&net.conflist(""), "another-forgotten-pod", &netns);
    env.d.restart();
    assert!(network_ready(&env).await.status);
    assert!(holds(&net, &stray));
    env.stop_pod(&pod).await;
    env.remove_pod(&pod).await;
    // The stray one is this test's own to release.
    std::fs::write(&file, &list).unwrap();
    env.d.restart();
    let t = Instant::now();
    while !net.allocations().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{:?}",
            net.allocations()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
