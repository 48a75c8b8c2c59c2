//! The CNI part of the benchmark: one bridge network list (bridge with host-local IPAM and
//! portmap, on a bridge and /24 of the benchmark's own, no masquerade, no route out) given to
//! every runtime, and the same plugin chain run alone (ADD then DEL on a fresh network
//! namespace, as a runtime chains them), so the table can show what each runtime adds above the
//! plugins. Everything the plugins leave (the bridge, portmap's chains) is removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Where the CNI plugins every runtime uses are: the release `hack/install-upstream.sh`
/// builds (role `cni-plugins`).
pub fn plugins() -> Result<PathBuf> {
    let dir = crate::upstream::dir("cni-plugins")?;
    if !dir.join("bridge").exists() {
        bail!(
            "no CNI plugins in {}: run hack/install-upstream.sh cni-plugins",
            dir.display()
        );
    }
    Ok(dir)
}

pub struct BenchNet {
    pub bridge: String,
    pub prefix: String,
    ipam: PathBuf,
    chains_before: Vec<String>,
    rules_before: Vec<String>,
}

/// The file name every runtime reads first (lexical order).
pub const FILE: &str = "00-bench-bridge.conflist";

fn iptables_save() -> String {
    Command::new("iptables-save")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn rules() -> Vec<String> {
    let mut table = String::new();
    let mut out = Vec::new();
    for l in iptables_save().lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
        } else if l.starts_with("-A") {
            out.push(format!("{table}:{l}"));
        }
    }
    out
}

fn chains() -> Vec<String> {
    iptables_save()
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

impl BenchNet {
    pub fn new(dir: &Path) -> Result<BenchNet> {
        plugins()?;
        let ipam = dir.join("cni-ipam");
        std::fs::create_dir_all(&ipam)?;
        Ok(BenchNet {
            bridge: "crbench0".into(),
            prefix: "10.233.7".into(),
            ipam,
            chains_before: chains(),
            rules_before: rules(),
        })
    }

    pub fn conflist(&self) -> String {
        self.conflist_with("")
    }

    /// The list with more plugins after portmap (`,{...}`), as crius's default list adds the
    /// firewall plugin.
    fn conflist_with(&self, more: &str) -> String {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"bench-bridge","plugins":[
  {{"type":"bridge","bridge":"{}","isGateway":true,"ipMasq":false,"hairpinMode":true,
    "ipam":{{"type":"host-local","dataDir":"{}","ranges":[[{{"subnet":"{}.0/24"}}]]}}}},
  {{"type":"portmap","capabilities":{{"portMappings":true}},"snat":true}}{more}
]}}"#,
            self.bridge,
            self.ipam.display(),
            self.prefix
        )
    }

    /// Runs the list's plugins as a runtime would, ADD then DEL, on a new network namespace:
    /// the time of the two, in ms (making and deleting the namespace not counted).
    pub fn chain_alone(&self, n: usize) -> Result<f64> {
        self.chain_alone_of(n, &self.conflist())
    }

    /// The same with the firewall plugin last, as in crius's default list (`dist/cni`).
    pub fn chain_alone_with_firewall(&self, n: usize) -> Result<f64> {
        self.chain_alone_of(n, &self.conflist_with(r#",{"type":"firewall"}"#))
    }

    fn chain_alone_of(&self, n: usize, list: &str) -> Result<f64> {
        let netns = format!("crbench-{n}");
        let ok = Command::new("ip")
            .args(["netns", "add", &netns])
            .status()?
            .success();
        if !ok {
            bail!("ip netns add {netns}");
        }
        let path = format!("/var/run/netns/{netns}");
        let id = format!("bench-chain-{n}");
        let list: serde_json::Value = serde_json::from_str(list)?;
        let plugins = list["plugins"].as_array().context("plugins")?.clone();
        let start = Instant::now();
        let mut prev: Option<serde_json::Value> = None;
        for p in &plugins {
            let out = self.exec("ADD", p, &list, prev.as_ref(), &id, &path)?;
            prev = Some(serde_json::from_slice(&out).context("plugin result")?);
        }
        for p in plugins.iter().rev() {
            self.exec("DEL", p, &list, prev.as_ref(), &id, &path)?;
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        let _ = Command::new("ip").args(["netns", "del", &netns]).status();
        Ok(ms)
    }

    fn exec(
        &self,
        command: &str,
        plugin: &serde_json::Value,
        list: &serde_json::Value,
        prev: Option<&serde_json::Value>,
        id: &str,
        netns: &str,
    ) -> Result<Vec<u8>> {
        let mut conf = plugin.clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        if let Some(p) = prev {
            conf["prevResult"] = p.clone();
        }
        if plugin["capabilities"]["portMappings"] == true {
            conf["runtimeConfig"] = serde_json::json!({"portMappings": []});
        }
        let kind = plugin["type"].as_str().context("plugin type")?;
        let plugins = plugins()?;
        let mut child = Command::new(plugins.join(kind))
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &plugins)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running the {kind} plugin"))?;
        use std::io::Write;
        child
            .stdin
            .take()
            .context("plugin stdin")?
            .write_all(&serde_json::to_vec(&conf)?)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "{kind} {command}: {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(out.stdout)
    }
}

/// An iptables-save rule's words, with quoted ones (comments) kept whole.
fn words(spec: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut escaped) = (Vec::new(), String::new(), false, false);
    for c in spec.chars() {
        match c {
            _ if escaped => {
                cur.push(c);
                escaped = false;
            }
            '\\' => escaped = true,
            '"' => quoted = !quoted,
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

impl Drop for BenchNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        for rule in rules() {
            if self.rules_before.contains(&rule) {
                continue;
            }
            if let Some((table, spec)) = rule.split_once(":-A ") {
                let mut args = vec!["-t".to_string(), table.to_string(), "-D".to_string()];
                args.extend(words(spec));
                let _ = Command::new("iptables").args(&args).output();
            }
        }
        for chain in chains() {
            if !self.chains_before.contains(&chain) {
                for t in ["nat", "filter"] {
                    let _ = Command::new("iptables")
                        .args(["-t", t, "-F", &chain])
                        .output();
                    let _ = Command::new("iptables")
                        .args(["-t", t, "-X", &chain])
                        .output();
                }
            }
        }
    }
}
