//! A pod network of a test's own for the CNI tests: the CNI plugins (the newest release, or
//! Debian's with `CRIUS_CNI=debian`) behind a private bin directory, a unique bridge and /24 with host-local IPAM in a temp dir, no masquerade and no
//! route out; what portmap adds to iptables for the test's pods is removed when it drops.

#![allow(clippy::unwrap_used)] // test scaffolding: a failure here is the test's failure

use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's CNI plugins (1.1.1 in Debian 12: what `hack/run.sh` gives a node).
pub const DEBIAN_PLUGINS: &str = "/usr/lib/cni";

/// Whether the tests use Debian's plugins (`CRIUS_CNI=debian`) rather than the newest release.
pub fn debian_plugins() -> bool {
    std::env::var("CRIUS_CNI").is_ok_and(|v| v == "debian")
}

/// Where the CNI plugins the tests use are: the newest release (`cni-plugins` of
/// `hack/upstream.versions`), or Debian's with `CRIUS_CNI=debian`.
pub fn plugins() -> PathBuf {
    if debian_plugins() {
        PathBuf::from(DEBIAN_PLUGINS)
    } else {
        super::upstream::dir("cni-plugins")
    }
}

pub fn plugins_present() -> bool {
    let dir = plugins();
    if dir.join("bridge").exists() {
        return true;
    }
    let how = if debian_plugins() {
        "hack/install-test-deps.sh installs them"
    } else {
        "hack/install-upstream.sh cni-plugins builds them"
    };
    super::missing(&format!("the CNI plugins in {} ({how})", dir.display()));
    false
}

/// A bridge network of the test's own: a unique bridge and /24, host-local IPAM in the test's
/// directory, portmap for hostPort; no masquerade and no default route.
pub struct TestNet {
    pub bridge: String,
    pub prefix: String,
    ipam: tempfile::TempDir,
    pub bin: tempfile::TempDir,
    chains_before: Vec<String>,
    rules_before: Vec<String>,
}

/// An iptables-save rule's words, quotes taken off.
pub fn shell_words(s: &str) -> Vec<String> {
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
    pub fn new() -> TestNet {
        let mut b = [0u8; 3];
        getrandom::fill(&mut b).unwrap();
        let bridge = format!("crt{}", hex::encode(b));
        let prefix = format!("10.{}.{}", 200 + b[0] % 50, b[1]);
        let bin = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(plugins()).unwrap().flatten() {
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
    pub fn conflist(&self, extra: &str) -> String {
        // Through the bridge's address, named: CNI CHECK compares routes with their gateways.
        let routes = node_address()
            .map(|a| format!(r#","routes":[{{"dst":"{a}/32","gw":"{}.1"}}]"#, self.prefix))
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

    pub fn portmap() -> &'static str {
        r#",{"type":"portmap","capabilities":{"portMappings":true},"snat":true}"#
    }

    pub fn tables(&self) -> String {
        format!(
            "[network]\nconf_dir = \"{{NET_D}}\"\nbin_dirs = [\"{}\"]\n",
            self.bin.path().display()
        )
    }

    /// IPs host-local holds for pods.
    pub fn allocations(&self) -> Vec<String> {
        list_files(self.ipam.path())
            .into_iter()
            .filter(|f| {
                f.split('/')
                    .next_back()
                    .is_some_and(|n| n.starts_with("10."))
            })
            .collect()
    }

    pub fn veths(&self) -> usize {
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

pub fn list_files(dir: &Path) -> Vec<String> {
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

pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rules of every table as `table:-A ...`, without counters and chain policies.
pub fn iptables_rules() -> Vec<String> {
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
pub fn pod_rules(before: &[String]) -> Vec<String> {
    iptables_rules()
        .into_iter()
        .filter(|r| !before.contains(r))
        .filter(|r| r.contains("CNI-DN-") || r.contains(" id: ") || r.contains("10."))
        .collect()
}

pub fn iptables_chains() -> Vec<String> {
    run(&mut Command::new("iptables-save"))
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The host's own address on its default route's interface.
pub fn node_address() -> Option<String> {
    let out = run(Command::new("ip").args(["-4", "-o", "route", "get", "192.0.2.1"]));
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "src" {
            return words.next().map(str::to_string);
        }
    }
    None
}
