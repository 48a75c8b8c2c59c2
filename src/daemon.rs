//! daemon: `crius daemon`. Prepares the root and state directories, takes the root's lock (one
//! daemon per root), opens the services, binds the CRI socket (mode 0660, owned by root) and
//! serves until SIGTERM or SIGINT. Uses `config` and opens the services of `image`, `sandbox`
//! and `container` (with the cgroup policy of `runtime::cgroup` and `systemd`) for `cri`.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{SignalKind, signal};

use crate::config::Config;
use crate::container::{self, ContainerService};
use crate::cri;
use crate::image::{self, ImageService};
use crate::sandbox::{self, SandboxService};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("another crius daemon is using {root} (its lock {lock} is held)")]
    Locked { root: PathBuf, lock: PathBuf },
    #[error("another runtime is already serving on {socket}")]
    SocketInUse { socket: PathBuf },
    #[error("opening the image store: {0}")]
    Images(#[from] image::Error),
    #[error("reading pod sandboxes: {0}")]
    Sandboxes(#[from] sandbox::Error),
    #[error("reading containers: {0}")]
    Containers(#[from] container::Error),
    #[error(transparent)]
    Stream(#[from] crate::stream::Error),
    #[error("streaming server: {0}")]
    StreamTls(#[from] crate::tls::Error),
    #[error("serving CRI: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error(
        "cgroup.driver is \"systemd\" but systemd does not run this node ({marker} is missing): use \"cgroupfs\""
    )]
    NoSystemd { marker: &'static str },
    #[error(
        "cgroup.parent {parent:?} must name a slice (letters, digits, single dashes inside) with the systemd driver"
    )]
    SliceName { parent: String },
    #[error("cgroup.driver is \"systemd\": {0}")]
    Systemd(#[from] crate::systemd::Error),
    #[error("runtime.sandbox_image: {0}")]
    SandboxImage(#[from] image::reference::ParseError),
}

/// The streaming server's TLS settings: the configured pair, or a self-signed certificate for
/// this node's hostname and the server's address.
fn stream_tls(
    cfg: &crate::config::Stream,
) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>, Error> {
    if !cfg.tls {
        return Ok(None);
    }
    let identity = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (Some(cert), Some(key)) => crate::tls::Identity::from_files(cert, key)?,
        _ => {
            let mut names = vec![
                "localhost".to_string(),
                "127.0.0.1".to_string(),
                "::1".to_string(),
            ];
            if let Ok(host) = nix::unistd::gethostname() {
                names.push(host.to_string_lossy().into_owned());
            }
            let unspecified = cfg
                .address
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_unspecified());
            if !unspecified && !names.contains(&cfg.address) {
                names.push(cfg.address.clone());
            }
            crate::tls::Identity::self_signed(names)?
        }
    };
    Ok(Some(std::sync::Arc::new(identity.server_config()?)))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn make_dir(path: &Path, mode: u32) -> Result<(), Error> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io_err(path))
}

/// How long in-flight RPCs may run on after SIGTERM.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Resolves on SIGTERM or SIGINT.
async fn termination() {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Runs the daemon until a termination signal.
pub async fn run(cfg: Config) -> Result<(), Error> {
    crate::fault::arm();
    if let Some(reference) = &cfg.runtime.sandbox_image {
        image::reference::Reference::parse(reference)?;
    }
    let _lock = lock_root(&cfg)?;
    // Helpers run from a copy of this binary that no container can write (CVE-2019-5736).
    let sealing = crate::runtime::exe::seal(&cfg.state).map_err(|e| Error::Io {
        path: std::path::PathBuf::from(crate::runtime::SELF_EXE),
        source: e,
    })?;
    tracing::info!(?sealing, "helpers run from a sealed executable");

    if cfg.cgroup.driver == "systemd"
        && !crate::runtime::cgroup::expand_slice(&format!("{}.slice", cfg.cgroup.parent))
            .is_ok_and(|p| !p.is_empty())
    {
        return Err(Error::SliceName {
            parent: cfg.cgroup.parent.clone(),
        });
    }
    let images = open_images(&cfg).await?;
    let nri = nri_settings(&cfg.nri).map(crate::nri::Nri::new);
    let (sandboxes, containers) = open_runtime(&cfg, &images, nri.as_ref()).await?;
    if let Some(addr) = &cfg.metrics.address {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(io_err(Path::new(addr)))?;
        tracing::info!(address = addr, "serving metrics on /metrics");
        tokio::spawn(serve_metrics(
            listener,
            sandboxes.clone(),
            containers.clone(),
        ));
    }
    let pods = open_pods(&cfg, &images, &sandboxes, &containers, nri).await;
    pods.serve_nri().await;
    let streams = start_streams(&cfg.stream, &pods).await?;
    let listener = bind(&cfg.socket).await?;
    tracing::info!(socket = %cfg.socket.display(), root = %cfg.root.display(), "crius daemon serving CRI runtime.v1");

    let nri_owner = pods.clone();
    let services = cri::Services {
        images,
        pods,
        streams,
        pause_image: cfg.runtime.sandbox_image.clone(),
        config: serde_json::to_value(&cfg).unwrap_or_default(),
    };
    let served = serve_until_terminated(listener, services).await;
    nri_owner.shutdown_nri();
    let _ = fs::remove_file(&cfg.socket);
    served?;
    Ok(())
}

/// Makes the root and state directories and takes the root's lock, held while it lives.
fn lock_root(cfg: &Config) -> Result<Flock<File>, Error> {
    make_dir(&cfg.root, 0o711)?;
    make_dir(&cfg.state, 0o711)?;
    let lock_path = cfg.root.join("crius.lock");
    let lock_file = File::create(&lock_path).map_err(io_err(&lock_path))?;
    Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| Error::Locked {
        root: cfg.root.clone(),
        lock: lock_path.clone(),
    })
}

/// Opens the image store (its startup checks run on a blocking thread).
async fn open_images(cfg: &Config) -> Result<ImageService, Error> {
    let opts = image::Options {
        root: cfg.root.clone(),
        config_path: cfg.registry.config_path.clone(),
        auth_file: cfg.registry.auth_file.clone(),
        allow_device_nodes: cfg.image.allow_device_nodes,
        signature_policy: cfg.image.signature_policy.clone(),
        max_concurrent_downloads: cfg.registry.max_concurrent_downloads,
        lazy_pull: cfg.image.lazy_pull,
        // Checked when the configuration was read.
        lazy_whole_pull_delay: humantime::parse_duration(&cfg.image.lazy_whole_pull_delay)
            .unwrap_or_default(),
    };
    let images = tokio::task::spawn_blocking(move || ImageService::open(&opts))
        .await
        .map_err(|e| Error::Io {
            path: cfg.root.clone(),
            source: io::Error::other(e),
        })??;
    images.recover_lazy();
    Ok(images)
}

/// The cgroup policy: the v2 hierarchy if mounted (said in the log either way), the driver,
/// the parent; the systemd driver only where systemd runs.
fn cgroup_policy(cfg: &Config) -> Result<crate::runtime::cgroup::Policy, Error> {
    let hierarchy = crate::runtime::cgroup::Hierarchy::detect();
    match &hierarchy {
        Some(h) => tracing::info!(controllers = h.controllers.join(" "), "cgroup v2 found"),
        None if cfg.cgroup.allow_unenforced => tracing::warn!(
            "cgroup v2 is not mounted at /sys/fs/cgroup: pods run WITHOUT resource limits (cgroup.allow_unenforced)"
        ),
        None => tracing::warn!(
            "cgroup v2 is not mounted at /sys/fs/cgroup: pods asking for resource limits are refused"
        ),
    }
    if cfg.cgroup.driver == "systemd" && hierarchy.is_some() && !crate::systemd::Manager::booted() {
        return Err(Error::NoSystemd {
            marker: crate::systemd::BOOTED_MARKER,
        });
    }
    // Without v2, containers' devices are confined by v1's devices controller.
    let devices_v1 = match &hierarchy {
        Some(_) => None,
        None => crate::runtime::devices::V1::detect(),
    };
    match (&hierarchy, &devices_v1) {
        (None, Some(v1)) => tracing::info!(
            root = %v1.root.display(),
            "containers' devices confined by cgroup v1's devices controller"
        ),
        (None, None) => tracing::warn!(
            "neither cgroup v2 nor cgroup v1's devices controller is mounted: only privileged containers can start"
        ),
        _ => {}
    }
    Ok(crate::runtime::cgroup::Policy {
        hierarchy,
        devices_v1,
        systemd: cfg.cgroup.driver == "systemd",
        parent: cfg.cgroup.parent.clone(),
        allow_unenforced: cfg.cgroup.allow_unenforced,
    })
}

/// Opens the sandbox and container services (connecting to systemd for its driver) and
/// removes the cgroups no container owns.
async fn open_runtime(
    cfg: &Config,
    images: &ImageService,
    nri: Option<&crate::nri::Nri>,
) -> Result<(SandboxService, ContainerService), Error> {
    let handlers: Vec<String> = cfg.runtime.handlers.keys().cloned().collect();
    let policy = cgroup_policy(cfg)?;
    let sandboxes = SandboxService::open(&cfg.state, handlers, policy, cfg.runtime.selinux)?;
    if let Some(sd) = sandboxes.systemd() {
        sd.connect().await?;
    }
    let containers = ContainerService::open(
        &cfg.root,
        &cfg.state,
        images.clone(),
        sandboxes.clone(),
        cfg.cdi
            .enable
            .then(|| crate::cdi::Registry::new(cfg.cdi.spec_dirs.clone())),
        nri.cloned(),
        cfg.checkpoint.restore_from_archive,
    )?;
    containers.remove_orphan_cgroups().await;
    containers.remove_orphan_devices_cgroups().await;
    Ok((sandboxes, containers))
}

/// The pod service over CNI (whose readiness is logged), its pods' networks recovered.
async fn open_pods(
    cfg: &Config,
    images: &ImageService,
    sandboxes: &SandboxService,
    containers: &ContainerService,
    nri: Option<crate::nri::Nri>,
) -> crate::pod::PodService {
    let network = std::sync::Arc::new(crate::network::NetworkService::new(
        cfg.network.conf_dir.clone(),
        cfg.network.bin_dirs.clone(),
    ));
    let readiness = network.configured();
    if readiness.ready {
        tracing::info!(
            network = readiness.message,
            "pods get their network from CNI"
        );
    } else {
        tracing::warn!(
            "{}: pods without host networking keep only loopback until a network list appears",
            readiness.message
        );
    }
    let pods = crate::pod::PodService::new(
        images.clone(),
        sandboxes.clone(),
        containers.clone(),
        network,
        nri,
    );
    pods.recover().await;
    pods
}

/// NRI's settings; none when it is turned off. The durations were checked with the config.
fn nri_settings(cfg: &crate::config::Nri) -> Option<crate::nri::Settings> {
    let duration = |text: &str, default: u64| {
        humantime::parse_duration(text).unwrap_or(std::time::Duration::from_secs(default))
    };
    cfg.enable.then(|| crate::nri::Settings {
        socket: (!cfg.disable_connections).then(|| cfg.socket_path.clone()),
        plugin_dir: cfg.plugin_path.clone(),
        plugin_config_dir: cfg.plugin_config_path.clone(),
        registration_timeout: duration(&cfg.plugin_registration_timeout, 5),
        request_timeout: duration(&cfg.plugin_request_timeout, 2),
    })
}

/// Starts the streaming server (exec, attach, port-forward) per the configuration.
async fn start_streams(
    cfg: &crate::config::Stream,
    pods: &crate::pod::PodService,
) -> Result<crate::stream::StreamServer, Error> {
    Ok(crate::stream::StreamServer::start(
        &crate::stream::Settings {
            address: cfg.address.clone(),
            port: cfg.port,
            idle_timeout: humantime::parse_duration(&cfg.stream_idle_timeout)
                .unwrap_or(std::time::Duration::from_secs(4 * 3600)),
            max_streams: cfg.max_streams,
            token_ttl: humantime::parse_duration(&cfg.token_ttl)
                .unwrap_or(crate::stream::TOKEN_TTL),
            tls: stream_tls(cfg)?,
        },
        std::sync::Arc::new(cri::streaming::StreamBackend { pods: pods.clone() }),
    )
    .await?)
}

/// Serves CRI on `listener` until it fails or a termination signal, after which in-flight
/// RPCs get a grace period.
async fn serve_until_terminated(
    listener: UnixListener,
    services: cri::Services,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serve = cri::serve(listener, services, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(serve);
    tokio::select! {
        r = &mut serve => r,
        () = termination() => {
            let _ = stop_tx.send(());
            // In-flight RPCs get a moment; idle client connections do not hold the daemon up.
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut serve).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::info!("clients still connected after the grace period; exiting");
                    Ok(())
                }
            }
        }
    }
}

/// Serves `GET /metrics` (the Prometheus text format), with the gauges measured per scrape.
async fn serve_metrics(
    listener: tokio::net::TcpListener,
    sandboxes: SandboxService,
    containers: ContainerService,
) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (sandboxes, containers) = (sandboxes.clone(), containers.clone());
        let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
            let (sandboxes, containers) = (sandboxes.clone(), containers.clone());
            async move {
                if req.uri().path() != "/metrics" || req.method() != hyper::Method::GET {
                    return hyper::Response::builder()
                        .status(404)
                        .body(Full::new(Bytes::from_static(b"not found\n")));
                }
                refresh_gauges(&sandboxes, &containers).await;
                hyper::Response::builder()
                    .header(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                    .body(Full::new(Bytes::from(crate::metrics::global().encode())))
            }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

/// Pods and containers by state, and the helpers' memory, as of now.
async fn refresh_gauges(sandboxes: &SandboxService, containers: &ContainerService) {
    use crate::container::config::ContainerState;
    let m = crate::metrics::global();
    let pods = sandboxes.list(None).await;
    let ready = pods
        .iter()
        .filter(|p| p.state == crate::sandbox::PodState::Ready)
        .count() as i64;
    crate::metrics::Metrics::set_states(
        &m.pods,
        &[("ready", ready), ("notready", pods.len() as i64 - ready)],
    );
    let all = containers.list(None).await;
    let count = |s: ContainerState| all.iter().filter(|c| c.state == s).count() as i64;
    crate::metrics::Metrics::set_states(
        &m.containers,
        &[
            ("created", count(ContainerState::Created)),
            ("running", count(ContainerState::Running)),
            ("exited", count(ContainerState::Exited)),
            ("unknown", count(ContainerState::Unknown)),
        ],
    );
    let _ = tokio::task::spawn_blocking(crate::metrics::sample_processes).await;
}

/// Binds the socket, replacing a stale one but never one a live runtime answers on.
async fn bind(socket: &Path) -> Result<UnixListener, Error> {
    if let Some(dir) = socket.parent() {
        make_dir(dir, 0o711)?;
    }
    if socket.exists() {
        // A crashed daemon's listener lives on in a helper it was starting when it died,
        // until that helper's exec closes it (long on a slow disk): give it a few seconds.
        // Another crius cannot be serving from this root (the lock says so); another runtime
        // on this path keeps accepting.
        let mut tries = 0;
        while UnixStream::connect(socket).await.is_ok() {
            tries += 1;
            if tries > 10 {
                return Err(Error::SocketInUse {
                    socket: socket.to_path_buf(),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        fs::remove_file(socket).map_err(io_err(socket))?;
    }
    let listener = UnixListener::bind(socket).map_err(io_err(socket))?;
    fs::set_permissions(socket, fs::Permissions::from_mode(0o660)).map_err(io_err(socket))?;
    std::os::unix::fs::chown(socket, Some(0), Some(0)).map_err(io_err(socket))?;
    Ok(listener)
}
