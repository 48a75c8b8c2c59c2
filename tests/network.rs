//! Pod networking through the real CNI plugins (Debian's containernetworking-plugins): pod IPs
//! on a bridge of the test's own (no masquerade, no route out), pods and the host reaching pods
//! by IP, hostPort through the portmap plugin, NetworkReady following the configuration
//! directory, clear errors from broken lists and missing plugins, and nothing left behind: no
//! veth, no IPAM allocation, no iptables rule, not after many cycles nor after the daemon is
//! killed in the middle of an ADD.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_cri::v1 as cri;

const PLUGINS: &str = "/usr/lib/cni";
const LONG: &[&str] = &["sleep", "100000"];

/// Tests here count host-wide things (links, iptables rules): one at a time.
static HOST: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn plugins_present() -> bool {
    if Path::new(PLUGINS).join("bridge").exists() {
        return true;
    }
    println!("skipped: no CNI plugins in {PLUGINS} (hack/install-test-deps.sh installs them)");
    false
}

/// A bridge network of the test's own: a unique bridge and /24, host-local IPAM in the test's
/// directory, portmap for hostPort; no masquerade and no default route.
struct TestNet {
    bridge: String,
    prefix: String,
    ipam: tempfile::TempDir,
    bin: tempfile::TempDir,
    chains_before: Vec<String>,
    rules_before: Vec<String>,
}

/// An iptables-save rule's words, quotes taken off.
fn shell_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

impl TestNet {
    fn new() -> TestNet {
        let mut b = [0u8; 3];
        getrandom::fill(&mut b).unwrap();
        let bridge = format!("crt{}", hex::encode(b));
        let prefix = format!("10.{}.{}", 200 + b[0] % 50, b[1]);
        let bin = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(PLUGINS).unwrap().flatten() {
            std::os::unix::fs::symlink(e.path(), bin.path().join(e.file_name())).unwrap();
        }
        TestNet {
            bridge,
            prefix,
            ipam: tempfile::tempdir().unwrap(),
            bin,
            chains_before: iptables_chains(),
            rules_before: iptables_rules(),
        }
    }

    /// The network list, with `extra` plugins after the bridge. Pods get a route to this
    /// node's own address only (for hostPort on it), none out.
    fn conflist(&self, extra: &str) -> String {
        let routes = node_address()
            .map(|a| format!(r#","routes":[{{"dst":"{a}/32"}}]"#))
            .unwrap_or_default();
        format!(
            r#"{{"cniVersion":"1.0.0","name":"crius-test","plugins":[
  {{"type":"bridge","bridge":"{}","isGateway":true,"ipMasq":false,"hairpinMode":true,
    "ipam":{{"type":"host-local","dataDir":"{}","ranges":[[{{"subnet":"{}.0/24"}}]]{routes}}}}}{extra}
]}}"#,
            self.bridge,
            self.ipam.path().display(),
            self.prefix
        )
    }

    fn portmap() -> &'static str {
        r#",{"type":"portmap","capabilities":{"portMappings":true},"snat":true}"#
    }

    fn tables(&self) -> String {
        format!(
            "[network]\nconf_dir = \"{{NET_D}}\"\nbin_dirs = [\"{}\"]\n",
            self.bin.path().display()
        )
    }

    /// IPs host-local holds for pods.
    fn allocations(&self) -> Vec<String> {
        list_files(self.ipam.path())
            .into_iter()
            .filter(|f| {
                f.split('/')
                    .next_back()
                    .is_some_and(|n| n.starts_with("10."))
            })
            .collect()
    }

    fn veths(&self) -> usize {
        let out = run(Command::new("ip").args(["-o", "link", "show", "master", &self.bridge]));
        out.lines().count()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        // portmap's shared rules, when the test's pods were the first to need them.
        for rule in iptables_rules() {
            if self.rules_before.contains(&rule) {
                continue;
            }
            if let Some((table, spec)) = rule.split_once(":-A ") {
                let mut args = vec!["-t".to_string(), table.to_string(), "-D".to_string()];
                args.extend(shell_words(spec));
                let _ = Command::new("iptables").args(&args).output();
            }
        }
        // Chains portmap made for the test's pods (empty by now) go too.
        for chain in iptables_chains() {
            if !self.chains_before.contains(&chain) {
                let _ = Command::new("iptables")
                    .args(["-t", "nat", "-F", &chain])
                    .output();
            }
        }
        for chain in iptables_chains() {
            if !self.chains_before.contains(&chain) {
                for t in ["nat", "filter"] {
                    let _ = Command::new("iptables")
                        .args(["-t", t, "-X", &chain])
                        .output();
                }
            }
        }
    }
}

fn list_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(list_files(&e.path()));
        } else {
            out.push(e.path().display().to_string());
        }
    }
    out
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rules of every table as `table:-A ...`, without counters and chain policies.
fn iptables_rules() -> Vec<String> {
    let mut table = String::new();
    let mut out = Vec::new();
    for l in run(&mut Command::new("iptables-save")).lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
        } else if l.starts_with("-A") {
            out.push(format!("{table}:{l}"));
        }
    }
    out
}

/// Rules that appeared since `before` and belong to a pod (portmap's per-pod chains and
/// rules naming a pod), as opposed to portmap's shared chains that every pod uses.
fn pod_rules(before: &[String]) -> Vec<String> {
    iptables_rules()
        .into_iter()
        .filter(|r| !before.contains(r))
        .filter(|r| r.contains("CNI-DN-") || r.contains(" id: ") || r.contains("10."))
        .collect()
}

fn iptables_chains() -> Vec<String> {
    run(&mut Command::new("iptables-save"))
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
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

/// The host's own address on its default route's interface.
fn node_address() -> Option<String> {
    let out = run(Command::new("ip").args(["-4", "-o", "route", "get", "192.0.2.1"]));
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "src" {
            return words.next().map(str::to_string);
        }
    }
    None
}

/// Two pods reach each other by IP, the host reaches them, hostPort answers on loopback and on
/// the node's address, the IP is in PodSandboxStatus and survives a daemon restart, a
/// host-network pod gets no attachment, NetworkReady follows the directory; afterwards nothing
/// of it is left.
#[tokio::test]
async fn pods_get_ips_and_reach_each_other() {
    if !plugins_present() {
        return;
    }
    let _host = HOST.lock().await;
    let net = TestNet::new();
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
    sh.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options
        .as_mut()
        .unwrap()
        .network = cri::NamespaceMode::Node as i32;
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
    if !plugins_present() {
        return;
    }
    let _host = HOST.lock().await;
    let net = TestNet::new();
    let rules_before = iptables_rules();
    // A plugin that takes its time before the real portmap: the daemon is killed meanwhile.
    let slow = net.bin.path().join("slow-portmap");
    std::fs::write(
        &slow,
        format!("#!/bin/sh\nsleep 3\nexec {PLUGINS}/portmap\n"),
    )
    .unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&slow).unwrap().permissions(),
        0o755,
    );
    std::fs::set_permissions(&slow, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut env = PodEnv::start_with(&net.tables()).await;
    let list = env.d.net_dir().join("10-test.conflist");
    std::fs::write(&list, net.conflist(TestNet::portmap())).unwrap();
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
        env.remove_pod(&pod).await;
    }
    assert_eq!((net.veths(), net.allocations().len()), (0, 0));
    assert_eq!(pod_rules(&rules_before), Vec::<String>::new());

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

/// A broken list and a missing plugin: RunPodSandbox fails naming the file or the plugin, and
/// leaves no pod, veth or allocation.
#[tokio::test]
async fn broken_lists_and_missing_plugins_are_named() {
    if !plugins_present() {
        return;
    }
    let _host = HOST.lock().await;
    let net = TestNet::new();
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
