//! `cargo xtask bench`: crius, the newest containerd, its LTS line's newest and CRI-O side by
//! side, on this machine, in one run, driven by the same CRI client code. Each round runs every
//! operation on every runtime, each going first in turn; the report (`report`) gives median, p90
//! and spread per operation and runtime, and crius's ratio to each peer; `plot` draws its JSON
//! as SVG.

mod agent;
mod cni;
mod crio;
mod entries;
mod images;
mod kubelet;
mod large;
mod load;
mod memory;
mod nri;
mod peers;
pub mod plot;
mod report;
mod steps;
mod stream;
mod sweep;
pub mod table;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crius::cri::v1 as cri;
use crius::cri::v1::image_service_client::ImageServiceClient;
use crius::cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use peers::Peer;
use report::{Results, report, stats};

/// The upstream parts the bench drives (`hack/install-upstream.sh` builds what is missing).
pub const UPSTREAM: &[&str] = &[
    "containerd",
    "containerd-lts",
    "crio",
    "cni-plugins",
    "clients",
    "kubernetes",
];

pub struct Options {
    pub rounds: usize,
    pub smoke: bool,
    pub large_mb: usize,
    /// The port-forward download (MiB).
    pub forward_mb: usize,
    pub concurrent: usize,
    pub memory_pods: Vec<usize>,
    pub idle_seconds: u64,
    /// Pods the agent keeps under TCP probes while its CPU is measured (0: skip).
    pub probed_pods: usize,
    pub probe_seconds: u64,
    /// Pods started under kubelet in each PLEG mode, in the VM (0: skip).
    pub kubelet_pods: usize,
    pub out: PathBuf,
    pub crius_bin: PathBuf,
    /// Busy loops kept running beside every runtime for the whole run (`--load N`): a node is
    /// rarely idle, and a runtime that falls apart beside other work is slow where it matters.
    pub load: usize,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut o = Options {
            rounds: 5,
            smoke: false,
            large_mb: 1024,
            forward_mb: 256,
            concurrent: 20,
            memory_pods: vec![20, 100],
            idle_seconds: 60,
            probed_pods: 100,
            probe_seconds: 30,
            kubelet_pods: 10,
            out: PathBuf::from("target/bench/results.json"),
            crius_bin: PathBuf::from("target/dist/crius"),
            load: 0,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || {
                it.next()
                    .cloned()
                    .with_context(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--rounds" => o.rounds = val()?.parse()?,
                "--large-mb" => o.large_mb = val()?.parse()?,
                "--forward-mb" => o.forward_mb = val()?.parse()?,
                "--concurrent" => o.concurrent = val()?.parse()?,
                "--idle-seconds" => o.idle_seconds = val()?.parse()?,
                "--probed-pods" => o.probed_pods = val()?.parse()?,
                "--probe-seconds" => o.probe_seconds = val()?.parse()?,
                "--kubelet-pods" => o.kubelet_pods = val()?.parse()?,
                "--out" => o.out = PathBuf::from(val()?),
                "--crius" => o.crius_bin = PathBuf::from(val()?),
                "--load" => o.load = val()?.parse()?,
                "--smoke" => {
                    o.smoke = true;
                    o.rounds = 1;
                    o.large_mb = 0;
                    o.forward_mb = 16;
                    o.concurrent = 5;
                    o.memory_pods = vec![5];
                    o.idle_seconds = 0;
                    o.probed_pods = 3;
                    o.probe_seconds = 3;
                    // A VM boot and two kubelets: the full run only.
                    o.kubelet_pods = 0;
                }
                other => bail!("unknown bench option {other}"),
            }
        }
        Ok(o)
    }
}

/// A runtime and its clients.
struct Rt {
    peer: Peer,
    rt: RuntimeServiceClient<Channel>,
    img: ImageServiceClient<Channel>,
    logs: PathBuf,
    seq: usize,
    /// The containers started in each pod, stopped before their pod as kubelet stops them.
    containers: std::collections::HashMap<String, Vec<String>>,
}

impl Rt {
    fn new(peer: Peer, logs: PathBuf) -> Rt {
        Rt {
            rt: crius::cri::client::runtime(peer.channel.clone()),
            img: crius::cri::client::images(peer.channel.clone()),
            peer,
            logs,
            seq: 0,
            containers: Default::default(),
        }
    }

    fn name(&self) -> &'static str {
        self.peer.kind.name()
    }

    fn sandbox_config(&mut self) -> cri::PodSandboxConfig {
        self.seq += 1;
        let name = format!("bench-{}", self.seq);
        let log_dir = self.logs.join(&name);
        let _ = std::fs::create_dir_all(&log_dir);
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.clone(),
                uid: format!("uid-{name}"),
                namespace: "bench".into(),
                attempt: 0,
            }),
            hostname: name,
            log_directory: log_dir.display().to_string(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: match self.peer.kind {
                    peers::Kind::Crio => crio::CGROUP_PARENT.into(),
                    _ => String::new(),
                },
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        pid: cri::NamespaceMode::Container as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container_config(image: &str, name: &str) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            // The name as the user gave it, as kubelet sends it: CRI-O checks its signature
            // policy against it, and refuses a container without it.
            image: Some(cri::ImageSpec {
                image: image.into(),
                user_specified_image: image.into(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "100000".into()],
            log_path: format!("{name}.log"),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        pid: cri::NamespaceMode::Container as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Waits until new pods get an address under `prefix` (the runtime has read the list).
    async fn wait_network(&mut self, prefix: &str) -> Result<()> {
        let start = Instant::now();
        loop {
            let (id, _) = self.run_pod().await?;
            let ip = self
                .rt
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: id.clone(),
                    verbose: false,
                })
                .await?
                .into_inner()
                .status
                .and_then(|s| s.network)
                .map(|n| n.ip)
                .unwrap_or_default();
            self.remove_pod(&id).await?;
            if ip.starts_with(prefix) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!(
                    "{}: pods got {ip:?}, not an address of the bench bridge",
                    self.name()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One sandbox run, stopped and removed: its time in ms.
    async fn sandbox_cycle_ms(&mut self) -> Result<f64> {
        let (_, ms) = timed(async {
            let (id, _) = self.run_pod().await?;
            self.remove_pod(&id).await
        })
        .await?;
        Ok(ms)
    }

    async fn run_pod(&mut self) -> Result<(String, cri::PodSandboxConfig)> {
        let cfg = self.sandbox_config();
        let id = self
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg.clone()),
                runtime_handler: String::new(),
            })
            .await
            .with_context(|| format!("{}: RunPodSandbox", self.name()))?
            .into_inner()
            .pod_sandbox_id;
        Ok((id, cfg))
    }

    async fn remove_pod(&mut self, id: &str) -> Result<()> {
        // Killed at once: CRI-O's StopPodSandbox gives a running container 9 s of its default
        // 10 s after SIGTERM, which `sleep` as PID 1 ignores.
        for c in self.containers.remove(id).unwrap_or_default() {
            self.rt
                .stop_container(cri::StopContainerRequest {
                    container_id: c,
                    timeout: 0,
                })
                .await
                .with_context(|| format!("{}: StopContainer", self.name()))?;
        }
        self.rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .with_context(|| format!("{}: StopPodSandbox", self.name()))?;
        self.rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .with_context(|| format!("{}: RemovePodSandbox", self.name()))?;
        Ok(())
    }

    async fn start_container(
        &mut self,
        pod: &str,
        sb: &cri::PodSandboxConfig,
        image: &str,
    ) -> Result<String> {
        self.start_container_cmd(pod, sb, image, &[]).await
    }

    /// A container running `cmd` (the default `sleep` when empty).
    async fn start_container_cmd(
        &mut self,
        pod: &str,
        sb: &cri::PodSandboxConfig,
        image: &str,
        cmd: &[&str],
    ) -> Result<String> {
        self.seq += 1;
        let name = format!("c{}", self.seq);
        let mut config = Self::container_config(image, &name);
        if !cmd.is_empty() {
            config.command = cmd.iter().map(|c| c.to_string()).collect();
        }
        let id = self
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(sb.clone()),
            })
            .await
            .with_context(|| format!("{}: CreateContainer", self.name()))?
            .into_inner()
            .container_id;
        self.rt
            .start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .with_context(|| format!("{}: StartContainer", self.name()))?;
        self.containers
            .entry(pod.to_string())
            .or_default()
            .push(id.clone());
        Ok(id)
    }

    async fn pull(&mut self, image: &str) -> Result<()> {
        self.img
            .pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .with_context(|| format!("{}: PullImage {image}", self.name()))?;
        Ok(())
    }

    async fn remove_image(&mut self, image: &str) -> Result<()> {
        self.img
            .remove_image(cri::RemoveImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
            })
            .await
            .with_context(|| format!("{}: RemoveImage {image}", self.name()))?;
        Ok(())
    }

    async fn pods(&mut self) -> Result<Vec<String>> {
        Ok(self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await?
            .into_inner()
            .items
            .into_iter()
            .map(|p| p.id)
            .collect())
    }

    async fn remove_all_pods(&mut self) -> Result<()> {
        for id in self.pods().await? {
            self.remove_pod(&id).await?;
        }
        Ok(())
    }

    /// Starts `n` pods with one container each, all at once; returns the time it took.
    async fn concurrent_pods(&mut self, n: usize, image: &str) -> Result<Duration> {
        let cfgs: Vec<cri::PodSandboxConfig> = (0..n).map(|_| self.sandbox_config()).collect();
        let start = Instant::now();
        let jobs = cfgs.into_iter().map(|cfg| {
            let mut rt = self.rt.clone();
            let image = image.to_string();
            async move {
                let pod = rt
                    .run_pod_sandbox(cri::RunPodSandboxRequest {
                        config: Some(cfg.clone()),
                        runtime_handler: String::new(),
                    })
                    .await?
                    .into_inner()
                    .pod_sandbox_id;
                let c = rt
                    .create_container(cri::CreateContainerRequest {
                        pod_sandbox_id: pod.clone(),
                        config: Some(Rt::container_config(&image, "c")),
                        sandbox_config: Some(cfg),
                    })
                    .await?
                    .into_inner()
                    .container_id;
                rt.start_container(cri::StartContainerRequest {
                    container_id: c.clone(),
                })
                .await?;
                Ok::<_, tonic::Status>((pod, c))
            }
        });
        for r in futures_util::future::join_all(jobs).await {
            let (pod, c) = r.with_context(|| format!("{}: concurrent pods", self.name()))?;
            self.containers.entry(pod).or_default().push(c);
        }
        Ok(start.elapsed())
    }
}

async fn timed<F, T>(f: F) -> Result<(T, f64)>
where
    F: std::future::Future<Output = Result<T>>,
{
    let start = Instant::now();
    let v = f.await?;
    Ok((v, start.elapsed().as_secs_f64() * 1000.0))
}

pub async fn run(o: Options) -> Result<()> {
    if !o.crius_bin.exists() {
        bail!(
            "{} is missing: build it with cargo build --release",
            o.crius_bin.display()
        );
    }
    // A fresh directory of its own (not a name another user could have made first), open to
    // all as a node's state directories are.
    let dir = tempfile::Builder::new().prefix("crius-bench-").tempdir()?;
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let tmp = dir.path().to_path_buf();
    // containerd's CNI code makes /run/netns a shared bind mount of itself and leaves it.
    let netns_was_mount = is_mount(Path::new("/run/netns"));
    cni::need_nft()?;
    let before = sweep::start()?;
    let mut signals = sweep::Signals::watch();
    let load = load::Load::start(o.load)?;
    // On a signal the run's future is dropped where it waits: its guards clean up as on error.
    let result = tokio::select! {
        r = run_in(&o, &tmp) => r,
        name = signals.first() => {
            eprintln!("bench: {name}: stopping and cleaning up (a second signal leaves it all)");
            Err(anyhow::anyhow!("interrupted by {name}"))
        }
    };
    signals.exit_on_next("leaving without cleaning up");
    drop(load);
    sweep::sweep(&before);
    for _ in 0..4 {
        if netns_was_mount || !is_mount(Path::new("/run/netns")) {
            break;
        }
        let _ = nix::mount::umount2("/run/netns", nix::mount::MntFlags::MNT_DETACH);
    }
    // Everything the benchmark made goes, whatever happened.
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "grep ' {t}' /proc/self/mountinfo | cut -d' ' -f5 | sort -r | xargs -r -n1 umount -l",
            t = tmp.display()
        ))
        .status();
    let _ = dir.close();
    result
}

/// Whether `path` is a mount point (in this mount namespace).
fn is_mount(path: &Path) -> bool {
    let want = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

async fn run_in(o: &Options, tmp: &Path) -> Result<()> {
    eprintln!("bench: building images");
    let registry = images::Registry::start(&tmp.join("registry"))?;
    let base = images::image(vec![images::busybox_layer("base")?], &["sh"]);
    let busybox = registry.push("busybox", "bench", &base).await?;
    let pause = registry
        .push(
            "pause",
            "bench",
            &images::image(
                vec![images::busybox_layer("pause")?],
                &["sleep", "2147483647"],
            ),
        )
        .await?;
    // Per round, one image per runtime, in the order the runtimes are started.
    let mut small = Vec::new();
    for r in 0..o.rounds {
        let mut round = Vec::new();
        for rt in peers::Kind::ALL.map(peers::Kind::name) {
            let img = images::image(
                vec![images::busybox_layer(&format!("small-{r}-{rt}"))?],
                &["sh"],
            );
            round.push(registry.push("small", &format!("r{r}-{rt}"), &img).await?);
        }
        small.push(round);
    }
    let large = if o.large_mb > 0 {
        large::build(&registry, o.large_mb, o.rounds).await?
    } else {
        Vec::new()
    };
    let many = entries::build(&registry, if o.smoke { 0 } else { o.rounds }).await?;

    eprintln!("bench: starting crius and its peers (containerd, containerd-lts, crio)");
    // Runtime state lives on tmpfs, as /run does on a node; images and layers on the disk.
    let run = tmp.join("run");
    std::fs::create_dir_all(&run)?;
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2g", "tmpfs"])
        .arg(&run)
        .status()?;
    if !status.success() {
        bail!("mounting a tmpfs for runtime state");
    }
    let crius = peers::start_crius(&o.crius_bin, &tmp.join("crius"), &run)?;
    let mut rts = vec![Rt::new(crius, tmp.join("logs/crius"))];
    for kind in peers::Kind::ALL.into_iter().skip(1) {
        let dir = tmp.join(kind.name());
        let peer = match kind {
            peers::Kind::Crio => crio::start(&dir, &run, &registry.host(), &pause)?,
            _ => peers::start_containerd(kind, &dir, &run, &registry.host(), &pause)?,
        };
        match peer {
            Some(p) => rts.push(Rt::new(p, tmp.join("logs").join(kind.name()))),
            None => bail!(
                "{} is not installed: run hack/install-upstream.sh {}",
                kind.name(),
                kind.role()
            ),
        }
    }
    let others: Vec<&'static str> = rts[1..].iter().map(|r| r.name()).collect();
    for rt in rts.iter_mut() {
        rt.pull(&busybox).await?;
        rt.pull(&pause).await?;
    }
    let mut res = Results::default();
    for rt in rts.iter() {
        let rss = peers::rss_kib(rt.peer.pid) as f64 / 1024.0;
        res.add("daemon RSS idle (MiB)", "MiB", rt.name(), rss);
    }

    let logger = nri::logger()?;
    for (round, small) in small.iter().enumerate() {
        eprintln!("bench: round {}/{}", round + 1, o.rounds);
        let order = turns(round, rts.len());
        for &i in &order {
            let rt = &mut rts[i];
            let name = rt.name();
            // Sandbox run + stop + remove.
            for _ in 0..5 {
                let ms = rt.sandbox_cycle_ms().await?;
                res.add("sandbox run+stop+remove", "ms", name, ms);
            }
            // Create + start, in a ready pod.
            let (pod, sb) = rt.run_pod().await?;
            let log = rt.peer.steps_log.clone();
            let from = log.as_deref().map(steps::mark);
            for _ in 0..5 {
                let (_, ms) = timed(rt.start_container(&pod, &sb, &busybox)).await?;
                res.add("container create+start", "ms", name, ms);
            }
            if let (Some(log), Some(from)) = (&log, from) {
                steps::add(&mut res, log, from)?;
            }
            // ExecSync of `true` in one of them.
            let containers = rt
                .rt
                .list_containers(cri::ListContainersRequest { filter: None })
                .await?
                .into_inner()
                .containers;
            let target = containers
                .first()
                .map(|c| c.id.clone())
                .context("no container to exec in")?;
            for _ in 0..10 {
                let (_, ms) = timed(async {
                    let r = rt
                        .rt
                        .exec_sync(cri::ExecSyncRequest {
                            container_id: target.clone(),
                            cmd: vec!["true".into()],
                            timeout: 10,
                        })
                        .await?
                        .into_inner();
                    if r.exit_code != 0 {
                        bail!("{name}: exec true exited {}", r.exit_code);
                    }
                    Ok(())
                })
                .await?;
                res.add("ExecSync true", "ms", name, ms);
            }
            rt.remove_pod(&pod).await?;
            // A pod with one container, from nothing to running.
            for _ in 0..3 {
                let (pod, ms) = timed(async {
                    let (pod, sb) = rt.run_pod().await?;
                    rt.start_container(&pod, &sb, &busybox).await?;
                    Ok(pod)
                })
                .await?;
                res.add("pod+container to running", "ms", name, ms);
                rt.remove_pod(&pod).await?;
            }
            // Cold pull of a small image nobody has.
            let img = &small[i];
            let (_, ms) = timed(rt.pull(img)).await?;
            res.add("cold pull small (1 MB)", "ms", name, ms);
            // Concurrent pods.
            let d = rt.concurrent_pods(o.concurrent, &busybox).await?;
            res.add(
                &format!("{} pods concurrently", o.concurrent),
                "ms",
                name,
                d.as_secs_f64() * 1000.0,
            );
            rt.remove_all_pods().await?;
        }
        if let Some(logger) = &logger {
            // Every runtime, each with the logger connected to its own socket.
            for &i in &order {
                let socket = tmp.join(rts[i].name()).join("nri/nri.sock");
                nri::logger_rows(&mut rts[i], logger, &socket, &busybox, &mut res).await?;
            }
        }
        if let Some(reference) = many.get(round) {
            entries::pull_rows(&mut rts, &order, reference, &mut res).await?;
        }
        if let Some(img) = large.get(round) {
            // The large pulls last in the round, after a pause for the disk (see field notes).
            tokio::time::sleep(Duration::from_secs(if o.smoke { 0 } else { 5 })).await;
            large::pull_rows(&mut rts, &order, img, o.large_mb, &mut res).await?;
            large::lazy_rows(&mut rts, &order, img, o.large_mb, &mut res).await?;
            // After the pulls: its file's delete must not fall on the first runtime's pull.
            large::floor_rows(&registry, img, o.large_mb, tmp, &mut res).await?;
        }
    }

    memory::rows(o, &mut rts, &busybox, &mut res).await?;
    if o.probed_pods > 0 {
        let rt = &rts[0];
        eprintln!(
            "bench: the agent with {} probed pods on {}",
            o.probed_pods,
            rt.name()
        );
        let cost = agent::probe_cost(
            &o.crius_bin,
            &rt.peer.socket,
            rt.peer.pid,
            &tmp.join("agent"),
            &busybox,
            o.probed_pods,
            o.probe_seconds,
        )
        .await?;
        let what = format!("{} pods TCP-probed every 1 s", o.probed_pods);
        res.add(
            &format!("agent CPU, {what} (% of a core)"),
            "%",
            rt.name(),
            cost.agent_pct,
        );
        res.add(
            &format!("daemon CPU, {what} (% of a core)"),
            "%",
            rt.name(),
            cost.daemon_pct,
        );
        res.add(
            "agent CPU per probe (us)",
            "us",
            rt.name(),
            cost.per_probe_us,
        );
    }
    eprintln!("bench: streaming");
    for round in 0..o.rounds {
        for i in turns(round, rts.len()) {
            stream::rows(&mut rts[i], &o.crius_bin, &busybox, o.forward_mb, &mut res).await?;
        }
    }
    cni::rows(o, tmp, &mut rts, &busybox, &mut res).await?;
    for rt in rts.iter_mut() {
        rt.peer.stop();
    }
    if o.kubelet_pods > 0 {
        eprintln!("bench: pod start under kubelet, relisting and evented PLEG (in the VM)");
        if let Some(p) = kubelet::pod_start(&o.crius_bin, o.kubelet_pods)? {
            const RELIST: &str = "pod to Running under kubelet (VM), relisting PLEG";
            const EVENTED: &str = "pod to Running under kubelet (VM), EventedPLEG";
            for ms in &p.relist_ms {
                res.add(RELIST, "ms", "crius", *ms);
            }
            for ms in &p.evented_ms {
                res.add(EVENTED, "ms", "crius", *ms);
            }
            if !p.relist_ms.is_empty() && !p.evented_ms.is_empty() {
                res.add(
                    "pod to Running under kubelet, EventedPLEG / relisting (medians)",
                    "x",
                    "crius",
                    stats(&p.evented_ms).median / stats(&p.relist_ms).median,
                );
            }
        }
    }
    report(&res, o, &others)?;
    Ok(())
}

/// The order the runtimes take their turns in a round: each goes first in turn.
fn turns(round: usize, n: usize) -> Vec<usize> {
    (0..n).map(|k| (k + round) % n).collect()
}
