//! The CNI part of the benchmark: one bridge network list (bridge with host-local IPAM and
//! portmap, on a bridge and /24 of the benchmark's own, no masquerade, no route out) given to
//! every runtime, and the same plugin chain run alone (ADD then DEL on a fresh network
//! namespace, as a runtime chains them), so the table can show what each runtime adds above the
//! plugins. A second list has portmap on nftables: iptables calls all take one lock, which is
//! what pods at once wait on. Everything the plugins leave (the bridge, portmap's chains and
//! tables) is removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::{Options, Results, Rt, stats, timed, turns};

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
    /// portmap's backend: iptables (its default here) or nftables.
    nftables: bool,
    chains_before: Vec<String>,
    rules_before: Vec<String>,
    tables_before: Vec<String>,
}

/// The nftables tables portmap's nftables backend makes (knftables' family and name).
const PORTMAP_TABLES: [&str; 2] = ["ip cni_hostport", "ip6 cni_hostport"];

/// Fails, naming the fix, when there is no `nft` for portmap's nftables backend to run.
pub fn need_nft() -> Result<()> {
    let ok = Command::new("nft").arg("--version").output();
    if !ok.is_ok_and(|o| o.status.success()) {
        bail!("no nft (portmap's nftables backend runs it): run hack/install-bench-deps.sh");
    }
    Ok(())
}

/// The nftables tables there are, as `family name`.
fn nft_tables() -> Vec<String> {
    Command::new("nft")
        .args(["list", "tables"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .map(str::to_string)
        .collect()
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
        Self::make(dir, "crbench0", "10.233.7", false)
    }

    /// The same list on a bridge and /24 of its own, portmap on nftables (needs `nft`, which
    /// hack/install-bench-deps.sh installs).
    pub fn with_nftables(dir: &Path) -> Result<BenchNet> {
        need_nft()?;
        Self::make(dir, "crbench1", "10.233.8", true)
    }

    fn make(dir: &Path, bridge: &str, prefix: &str, nftables: bool) -> Result<BenchNet> {
        plugins()?;
        let ipam = dir.join(format!("cni-ipam-{bridge}"));
        std::fs::create_dir_all(&ipam)?;
        Ok(BenchNet {
            bridge: bridge.into(),
            prefix: prefix.into(),
            ipam,
            nftables,
            chains_before: chains(),
            rules_before: rules(),
            tables_before: nft_tables(),
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
  {{"type":"portmap","capabilities":{{"portMappings":true}},"snat":true{backend}}}{more}
]}}"#,
            self.bridge,
            self.ipam.display(),
            self.prefix,
            backend = if self.nftables {
                r#","backend":"nftables""#
            } else {
                ""
            },
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
        if self.nftables {
            for table in PORTMAP_TABLES {
                if !self.tables_before.iter().any(|t| t == table) {
                    let mut args = vec!["delete", "table"];
                    args.extend(table.split(' '));
                    let _ = Command::new("nft").args(&args).output();
                }
            }
        }
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

/// Gives every runtime `net`'s list, in place of any list of the bench's before, and waits
/// until each runtime's pods get its addresses.
async fn give(rts: &mut [Rt], net: &BenchNet) -> Result<()> {
    for rt in rts.iter() {
        std::fs::write(rt.peer.cni_conf.join(FILE), net.conflist())?;
    }
    for rt in rts.iter_mut() {
        rt.wait_network(&net.prefix).await?;
    }
    Ok(())
}

/// Pods on the same CNI bridge list for every runtime, and the plugin chain alone: what each
/// runtime adds above the plugins is the difference of the medians.
pub async fn rows(
    o: &Options,
    tmp: &Path,
    rts: &mut [Rt],
    image: &str,
    res: &mut Results,
) -> Result<()> {
    eprintln!("bench: pods on a CNI bridge");
    let net = BenchNet::new(tmp)?;
    give(rts, &net).await?;
    const SANDBOX: &str = "sandbox run+stop+remove, CNI bridge";
    const CHAIN: &str = "CNI bridge+portmap alone, ADD+DEL (no runtime)";
    // crius's default list (dist/cni) adds the firewall plugin: what that costs.
    const CHAIN_FIREWALL: &str = "CNI bridge+portmap+firewall alone, ADD+DEL (no runtime)";
    const ABOVE_OWN: &str = "sandbox with CNI above its own plugin runs, per pod";
    for round in 0..o.rounds {
        for i in turns(round, rts.len()) {
            let rt = &mut rts[i];
            let name = rt.name();
            for _ in 0..5 {
                let before = rt.peer.plugin_seconds()?;
                let ms = rt.sandbox_cycle_ms().await?;
                res.add(SANDBOX, "ms", name, ms);
                // crius times its plugin runs: what it adds above them, pod by pod (the
                // plugins' own time varies by tens of ms, mostly the kernel deleting the veth).
                if let (Some(b), Some(a)) = (before, rt.peer.plugin_seconds()?) {
                    res.add(ABOVE_OWN, "ms", name, ms - (a - b) * 1000.0);
                }
            }
            for _ in 0..3 {
                let (pod, ms) = timed(async {
                    let (pod, sb) = rt.run_pod().await?;
                    rt.start_container(&pod, &sb, image).await?;
                    Ok(pod)
                })
                .await?;
                res.add("pod+container to running, CNI bridge", "ms", name, ms);
                rt.remove_pod(&pod).await?;
            }
            // Pods at once on the network: plugin chains side by side where the runtime
            // lets them.
            let d = rt.concurrent_pods(o.concurrent, image).await?;
            res.add(
                &format!("{} pods+containers concurrently, CNI bridge", o.concurrent),
                "ms",
                name,
                d.as_secs_f64() * 1000.0,
            );
            rt.remove_all_pods().await?;
        }
        for n in 0..5 {
            res.add(CHAIN, "ms", "crius", net.chain_alone(round * 5 + n)?);
            res.add(
                CHAIN_FIREWALL,
                "ms",
                "crius",
                net.chain_alone_with_firewall(round * 5 + n)?,
            );
        }
    }
    let median = |rt: &str, op: &str| {
        res.samples
            .get(op)
            .and_then(|m| m.get(rt))
            .map(|v| stats(v).median)
    };
    if let Some(chain) = median("crius", CHAIN) {
        let names: Vec<&'static str> = rts.iter().map(|r| r.name()).collect();
        let above: Vec<(&str, f64)> = names
            .into_iter()
            .filter_map(|rt| median(rt, SANDBOX).map(|sb| (rt, sb - chain)))
            .collect();
        for (rt, ms) in above {
            res.add(
                "sandbox with CNI above the plugin chain (medians)",
                "ms",
                rt,
                ms,
            );
        }
    }
    nftables_rows(o, tmp, rts, image, res).await?;
    for rt in rts.iter() {
        std::fs::remove_file(rt.peer.cni_conf.join(FILE))?;
    }
    Ok(())
}

/// The same list with portmap on nftables, in place of the iptables one: pods alone and at once,
/// and the chain alone. iptables calls all take one lock (`/run/xtables.lock`), nft's do not.
async fn nftables_rows(
    o: &Options,
    tmp: &Path,
    rts: &mut [Rt],
    image: &str,
    res: &mut Results,
) -> Result<()> {
    eprintln!("bench: pods on a CNI bridge, portmap on nftables");
    let net = BenchNet::with_nftables(tmp)?;
    give(rts, &net).await?;
    for round in 0..o.rounds {
        for i in turns(round, rts.len()) {
            let rt = &mut rts[i];
            let name = rt.name();
            for _ in 0..5 {
                let ms = rt.sandbox_cycle_ms().await?;
                res.add(
                    "sandbox run+stop+remove, CNI bridge, portmap on nftables",
                    "ms",
                    name,
                    ms,
                );
            }
            let d = rt.concurrent_pods(o.concurrent, image).await?;
            res.add(
                &format!(
                    "{} pods+containers concurrently, CNI bridge, portmap on nftables",
                    o.concurrent
                ),
                "ms",
                name,
                d.as_secs_f64() * 1000.0,
            );
            rt.remove_all_pods().await?;
        }
        for n in 0..5 {
            res.add(
                "CNI bridge+portmap (nftables) alone, ADD+DEL (no runtime)",
                "ms",
                "crius",
                // Namespace names apart from the iptables list's.
                net.chain_alone(1000 + round * 5 + n)?,
            );
        }
    }
    Ok(())
}
