//! The runtimes under test, each with private state under the benchmark's directory and its own
//! socket: crius (the release binary), and the newest containerd and the LTS line's newest, each
//! with its runc shim (built from their module by `hack/install-upstream.sh`, roles `containerd`
//! and `containerd-lts`), on Debian's runc; CRI-O is started by `crio`.
//! containerd needs `restrict_oom_score_adj` on these machines, a pause image (built from
//! busybox here) and a CNI result with an address: it gets Debian's `loopback` plugin plus a
//! no-op plugin that reports one (CRI-O gets the same), so every runtime gives pods a
//! loopback-only network, until the CNI rows put the same bridge list first in every runtime's
//! directory (`cni`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tonic::transport::Channel;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Crius,
    /// The newest containerd release.
    Containerd,
    /// The newest of containerd's LTS line.
    ContainerdLts,
    /// The newest CRI-O release the module proxy serves.
    Crio,
}

impl Kind {
    /// Every runtime, in the order the bench starts them (crius first: the others are its peers).
    pub const ALL: [Kind; 4] = [
        Kind::Crius,
        Kind::Containerd,
        Kind::ContainerdLts,
        Kind::Crio,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Crius => "crius",
            Kind::Containerd => "containerd",
            Kind::ContainerdLts => "containerd-lts",
            Kind::Crio => "crio",
        }
    }

    /// The peer's role in `hack/upstream.versions` (none for crius).
    pub fn role(self) -> &'static str {
        match self {
            Kind::Crius => "",
            Kind::Containerd => "containerd",
            Kind::ContainerdLts => "containerd-lts",
            Kind::Crio => "crio",
        }
    }
}

pub struct Peer {
    pub kind: Kind,
    pub socket: PathBuf,
    pub pid: i32,
    child: Child,
    pub channel: Channel,
    /// The runtime's CNI configuration directory.
    pub cni_conf: PathBuf,
    /// Where crius serves its Prometheus metrics (none for containerd).
    pub metrics: Option<String>,
    /// crius's log, with its step times of each container create and start.
    pub steps_log: Option<PathBuf>,
    /// What CRI-O leaves on the host, cleaned once the daemon has stopped.
    pub crio: Option<super::crio::Cleanup>,
}

fn wait_socket(socket: &Path, child: &mut Child, log: &Path) -> Result<()> {
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!(
                "exited ({status}) before serving: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "no socket after 60 s: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

pub fn start_crius(bin: &Path, dir: &Path, run: &Path) -> Result<Peer> {
    std::fs::create_dir_all(dir)?;
    let socket = dir.join("crius.sock");
    let cfg = dir.join("config.toml");
    // No network list until the CNI rows: pods keep only loopback, like containerd's below.
    let cni_conf = dir.join("cni-conf");
    std::fs::create_dir_all(&cni_conf)?;
    // Metrics on a free port, for the time spent in CNI plugins.
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string();
    std::fs::write(
        &cfg,
        format!(
            "[registry]\nconfig_path = \"{}\"\n[network]\nconf_dir = \"{}\"\nbin_dirs = [\"{}\"]\n\
             [metrics]\naddress = \"{metrics}\"\n\
             [nri]\nsocket_path = \"{nri}/nri.sock\"\nplugin_path = \"{nri}/plugins\"\n\
             [image]\nlazy_pull = true\nlazy_whole_pull_delay = \"1h\"\n",
            dir.join("certs.d").display(),
            cni_conf.display(),
            super::cni::plugins()?.display(),
            nri = dir.join("nri").display(),
        ),
    )?;
    let log = dir.join("daemon.log");
    let mut child = Command::new(bin)
        // Warnings, and the step times of creates and starts (one line each).
        .args([
            "daemon",
            "--log-level",
            "warn,crius::container::steps=debug",
        ])
        .arg("--config")
        .arg(&cfg)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(run.join("crius"))
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::options().append(true).open(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    wait_socket(&socket, &mut child, &log).context("crius")?;
    let channel = crius::cri::client::channel(&socket)?;
    Ok(Peer {
        kind: Kind::Crius,
        pid: child.id() as i32,
        socket,
        child,
        channel,
        cni_conf,
        metrics: Some(metrics),
        steps_log: Some(log),
        crio: None,
    })
}

/// The CNI directories the containerds and CRI-O read: loopback and a plugin reporting an
/// address, and the bridge list's plugins for the CNI rows. Returns the configuration and the
/// binary directory.
pub fn cni_dirs(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let cni_conf = dir.join("cni-conf");
    let cni_bin = dir.join("cni-bin");
    std::fs::create_dir_all(&cni_conf)?;
    std::fs::create_dir_all(&cni_bin)?;
    for plugin in ["loopback", "bridge", "host-local", "portmap"] {
        let from = super::cni::plugins()?.join(plugin);
        std::os::unix::fs::symlink(from, cni_bin.join(plugin)).ok();
    }
    // A plugin that does nothing but report an address on eth0: containerd insists on one.
    let noop = cni_bin.join("bench-addr");
    std::fs::write(
        &noop,
        "#!/bin/sh\ncase \"$CNI_COMMAND\" in\nADD) printf '{\"cniVersion\":\"0.4.0\",\"interfaces\":[{\"name\":\"eth0\",\"sandbox\":\"%s\"}],\"ips\":[{\"version\":\"4\",\"address\":\"10.88.0.2/16\",\"interface\":0}]}' \"$CNI_NETNS\";;\nVERSION) printf '{\"cniVersion\":\"0.4.0\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\"]}';;\nesac\nexit 0\n",
    )?;
    std::fs::set_permissions(&noop, std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(
        cni_conf.join("10-bench.conflist"),
        r#"{"cniVersion":"0.4.0","name":"bench","plugins":[{"type":"loopback"},{"type":"bench-addr"}]}"#,
    )?;
    Ok((cni_conf, cni_bin))
}

/// What both containerds read besides their config: the CNI directories and the registry's
/// hosts.toml. Returns the socket, the CNI configuration and binary directories.
fn containerd_files(dir: &Path, registry: &str) -> Result<(PathBuf, PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let socket = dir.join("containerd.sock");
    let (cni_conf, cni_bin) = cni_dirs(dir)?;
    let certs = dir.join("certs.d").join(registry);
    std::fs::create_dir_all(&certs)?;
    std::fs::write(
        certs.join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )?;
    Ok((socket, cni_conf, cni_bin))
}

/// The start of a containerd config of `version`: its directories, sockets and log level.
fn containerd_header(version: u32, dir: &Path, state: &Path, socket: &Path) -> String {
    format!(
        r#"version = {version}
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  level = "warn"
"#,
        root = dir.join("root").display(),
        state = state.display(),
        socket = socket.display(),
    )
}

/// Starts a peer's daemon with its output in `log` and waits for its socket; a daemon that never
/// serves is ended.
pub fn spawn(
    kind: Kind,
    cmd: &mut Command,
    log: &Path,
    socket: PathBuf,
    cni_conf: PathBuf,
) -> Result<Peer> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log)?)
        .stderr(std::fs::File::options().append(true).open(log)?)
        .spawn()?;
    let served = wait_socket(&socket, &mut child, log)
        .and_then(|()| Ok(crius::cri::client::channel(&socket)?));
    let channel = match served {
        Ok(c) => c,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.context(kind.name()));
        }
    };
    Ok(Peer {
        kind,
        pid: child.id() as i32,
        socket,
        child,
        channel,
        cni_conf,
        metrics: None,
        steps_log: None,
        crio: None,
    })
}

/// A containerd of `kind` with config version 3, its shim first on its PATH; none when it is not
/// installed.
pub fn start_containerd(
    kind: Kind,
    dir: &Path,
    run: &Path,
    registry: &str,
    pause: &str,
) -> Result<Option<Peer>> {
    let Some(daemon) = crate::upstream::find(kind.role(), "containerd")? else {
        return Ok(None);
    };
    let bin = daemon
        .parent()
        .context("containerd's directory")?
        .to_path_buf();
    let (socket, cni_conf, cni_bin) = containerd_files(dir, registry)?;
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"{header}[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "{nri}/nri.sock"
  plugin_path = "{nri}/plugins"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{certs}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
"#,
            header = containerd_header(3, dir, &run.join(kind.name()), &socket),
            // On, as containerd 2 ships it: the nri-logger rows connect a plugin to it.
            nri = dir.join("nri").display(),
            certs = dir.join("certs.d").display(),
            cni_bin = cni_bin.display(),
            cni_conf = cni_conf.display(),
        ),
    )?;
    let mut cmd = Command::new(&daemon);
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{}:{path}", bin.display()))
        .arg("--config")
        .arg(&cfg);
    spawn(
        kind,
        &mut cmd,
        &dir.join("containerd.log"),
        socket,
        cni_conf,
    )
    .map(Some)
    .with_context(|| format!("starting {}", daemon.display()))
}

impl Peer {
    /// Seconds crius has spent in CNI plugins so far (the sum over plugins and operations of
    /// `crius_network_plugin_duration_seconds`); none for containerd.
    pub fn plugin_seconds(&self) -> Result<Option<f64>> {
        let Some(addr) = &self.metrics else {
            return Ok(None);
        };
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let sum = text
            .lines()
            .filter(|l| l.starts_with("crius_network_plugin_duration_seconds_sum"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Ok(Some(sum))
    }

    /// Stops the runtime (its pods are removed by the caller first), then cleans what it leaves.
    pub fn stop(&mut self) {
        self.stop_daemon();
        // Dropped here, once: the daemon no longer uses what it cleans.
        self.crio.take();
    }

    fn stop_daemon(&mut self) {
        // Stopped before (the pid may be another process's by now).
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Resident memory of a process in KiB.
pub fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS:").unwrap_or(0)
}

/// A field of `/proc/PID/status` given in kB (`VmRSS:`, `VmHWM:`).
pub fn status_kib(pid: i32, field: &str) -> Option<u64> {
    proc_kib(&format!("/proc/{pid}/status"), field)
}

/// The kB figure of the line starting with `field` in a proc file.
fn proc_kib(path: &str, field: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    })
}

/// Proportional set size of a process in KiB (shared pages divided among their users).
pub fn pss_kib(pid: i32) -> u64 {
    proc_kib(&format!("/proc/{pid}/smaps_rollup"), "Pss:").unwrap_or(0)
}

/// User + system CPU time of a process, in clock ticks.
pub fn cpu_ticks(pid: i32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
}

/// Every process's pid, parent pid, state (`R`, `S`, `Z`...) and comm, from /proc/PID/stat.
pub fn tasks() -> Vec<(i32, i32, String, String)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // The comm may hold spaces and parentheses: the fields resume after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head
            .split_once('(')
            .map(|(_, c)| c.to_string())
            .unwrap_or_default();
        let mut f = rest.split_whitespace();
        let state = f.next().unwrap_or_default().to_string();
        let ppid = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        out.push((pid, ppid, state, comm));
    }
    out
}

/// Live processes with their parent pid, comm and command line.
pub fn processes() -> Vec<(i32, i32, String, String)> {
    tasks()
        .into_iter()
        .filter(|t| t.2 != "Z")
        .map(|(pid, ppid, _, comm)| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            (pid, ppid, comm, cmd)
        })
        .collect()
}

/// The per-pod processes a runtime runs besides the workloads: (monitors or shims, pause holders).
pub fn helper_pids(peer: &Peer) -> (Vec<i32>, Vec<i32>) {
    let procs = processes();
    match peer.kind {
        Kind::Crius => {
            // Both are the daemon's own children.
            let monitors = procs
                .iter()
                .filter(|p| p.2 == "crius-monitor" && p.1 == peer.pid)
                .map(|p| p.0)
                .collect();
            let pauses = procs
                .iter()
                .filter(|p| p.2 == "pause" && p.1 == peer.pid)
                .map(|p| p.0)
                .collect();
            (monitors, pauses)
        }
        Kind::Containerd | Kind::ContainerdLts => {
            let addr = peer.socket.display().to_string();
            let shims: Vec<i32> = procs
                .iter()
                .filter(|p| p.3.contains("containerd-shim-runc-v2") && p.3.contains(&addr))
                .map(|p| p.0)
                .collect();
            let pauses = procs
                .iter()
                .filter(|p| shims.contains(&p.1) && p.3.contains("sleep 2147483647"))
                .map(|p| p.0)
                .collect();
            (shims, pauses)
        }
        // No pause holders: its pods keep no infra container (`crio`).
        Kind::Crio => match &peer.crio {
            Some(c) => (c.monitors(&procs), Vec::new()),
            None => (Vec::new(), Vec::new()),
        },
    }
}
