//! config: the daemon's TOML configuration (`/etc/crius/config.toml`). Every key is optional and
//! has a default that runs crius on a stock node; unknown keys are errors naming the file and
//! line, so a typo never silently falls back to a default (the pause image's reference is the
//! daemon's to check, with `image`). Uses `serde` and `toml`, nothing of crius's.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const DEFAULT_CONFIG: &str = "/etc/crius/config.toml";
/// Every key with its default and what it does (`crius config default`, the package's file).
pub const DEFAULT_TEXT: &str = include_str!("../dist/config.toml");
pub const DEFAULT_SOCKET: &str = "/run/crius/crius.sock";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse { path: PathBuf, source: ParseError },
}

/// What is wrong with a config file's text.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not TOML, or not crius's keys and types; where, when the parser knows.
    #[error("{}", toml_text(*.at, .source))]
    Toml {
        at: Option<(usize, usize)>,
        source: Box<toml::de::Error>,
    },
    /// A setting's value is not one it may take.
    #[error("{setting} {value:?} {must}")]
    Setting {
        setting: &'static str,
        value: String,
        must: &'static str,
    },
    /// Settings that do not fit together.
    #[error("{0}")]
    Rule(&'static str),
}

/// A TOML error: `line L, column C: what`, or only what.
fn toml_text(at: Option<(usize, usize)>, e: &toml::de::Error) -> String {
    match at {
        Some((line, col)) => format!("line {line}, column {col}: {}", e.message()),
        None => e.message().to_string(),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The CRI socket.
    pub socket: PathBuf,
    /// Persistent data: content store, snapshots, image and container records.
    pub root: PathBuf,
    /// Runtime state that must not survive a reboot: namespace handles, mounts, sockets.
    pub state: PathBuf,
    /// `error`, `warn`, `info`, `debug`, `trace`, or a tracing filter directive.
    pub log_level: String,
    /// `text`, or `json` (one object per line, for log collectors).
    pub log_format: String,
    pub registry: Registry,
    pub image: Image,
    pub runtime: Runtime,
    pub cgroup: Cgroup,
    pub agent: Agent,
    pub metrics: Metrics,
    pub network: Network,
    pub stream: Stream,
    pub cdi: Cdi,
    pub nri: Nri,
    pub checkpoint: Checkpoint,
}

/// Checkpoints with criu (CheckpointContainer) and restores from their archives.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Checkpoint {
    /// Restore through CreateContainer (an image that is an archive's path). Off, as in
    /// containerd: an archive is input from whoever can write a file on the node.
    pub restore_from_archive: bool,
}

/// CDI devices (`ContainerConfig.cdi_devices`, `cdi.k8s.io/` annotations).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Cdi {
    /// Off, a container that asks for a CDI device is refused (never started without it).
    pub enable: bool,
    /// Where spec files are read, lowest priority first: a device defined again in a later
    /// directory replaces the earlier one.
    pub spec_dirs: Vec<PathBuf>,
}

impl Default for Cdi {
    fn default() -> Cdi {
        Cdi {
            enable: true,
            spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
        }
    }
}

/// NRI plugins: external ones connect to `socket_path`; pre-installed ones are started from
/// `plugin_path` with their configuration from `plugin_config_path`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Nri {
    pub enable: bool,
    pub socket_path: PathBuf,
    pub plugin_path: PathBuf,
    pub plugin_config_path: PathBuf,
    /// How long a plugin may take to register once connected or started.
    pub plugin_registration_timeout: String,
    /// How long a plugin may take to answer an event (its synchronization gets at least 5 s).
    pub plugin_request_timeout: String,
    /// Only pre-installed plugins: nothing listens on the socket.
    pub disable_connections: bool,
}

impl Default for Nri {
    fn default() -> Nri {
        Nri {
            enable: true,
            socket_path: PathBuf::from("/var/run/nri/nri.sock"),
            plugin_path: PathBuf::from("/opt/nri/plugins"),
            plugin_config_path: PathBuf::from("/etc/nri/conf.d"),
            plugin_registration_timeout: "5s".to_string(),
            plugin_request_timeout: "2s".to_string(),
            disable_connections: false,
        }
    }
}

/// The streaming server of Exec and PortForward.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Stream {
    /// The address it listens on; kubelet proxies to it from the same node.
    pub address: String,
    /// The port; 0 picks a free one.
    pub port: u16,
    /// A stream with no traffic either way for this long is closed (`4h`, `30m`, ...).
    pub stream_idle_timeout: String,
    /// Streams at once; more are refused (HTTP 429).
    pub max_streams: usize,
    /// How long a URL from Exec, Attach or PortForward stays valid (`1m`).
    pub token_ttl: String,
    /// Serve HTTPS: with `tls_cert_file` and `tls_key_file` (PEM), or else with a self-signed
    /// certificate made at each start.
    pub tls: bool,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
}

impl Default for Stream {
    fn default() -> Stream {
        Stream {
            address: "127.0.0.1".to_string(),
            port: 0,
            stream_idle_timeout: "4h".to_string(),
            max_streams: 256,
            token_ttl: "1m".to_string(),
            tls: false,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

/// Pod networks through CNI.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Network {
    /// Where network lists are read: the first `.conflist`, `.conf` or `.json` in lexical order.
    pub conf_dir: PathBuf,
    /// Where plugins are looked up, in order.
    pub bin_dirs: Vec<PathBuf>,
}

impl Default for Network {
    fn default() -> Network {
        Network {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
        }
    }
}

/// Prometheus metrics (`GET /metrics`), off unless an address is given.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Metrics {
    /// `host:port` to serve on, e.g. `127.0.0.1:9090`.
    pub address: Option<String>,
}

/// The pod agent (`crius agent`, `crius run`, `crius get pods`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Agent {
    /// The watched directory of Pod, Secret and ConfigMap manifests.
    pub manifests: PathBuf,
    /// The agent's records and pod volumes.
    pub state: PathBuf,
    /// Container logs, `<log_dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log`.
    pub log_dir: PathBuf,
    /// `NoSwap` or `LimitedSwap`, as kubelet's `memorySwap.swapBehavior`.
    pub swap_behavior: String,
    /// Where `Localhost` seccomp profiles are looked up, as kubelet's `<root>/seccomp`.
    pub seccomp_root: PathBuf,
}

impl Default for Agent {
    fn default() -> Agent {
        Agent {
            manifests: PathBuf::from("/etc/crius/manifests"),
            state: PathBuf::from("/var/lib/crius/agent"),
            log_dir: PathBuf::from("/var/log/pods"),
            swap_behavior: "NoSwap".to_string(),
            seccomp_root: PathBuf::from("/var/lib/kubelet/seccomp"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Cgroup {
    /// `cgroupfs` (crius writes the unified hierarchy itself) or `systemd` (as runc's systemd
    /// driver: pods and containers get transient systemd units, scopes in kubelet's pod slices
    /// or slices of crius's own, with their limits as unit properties; crius writes the files
    /// too). Must match kubelet's `cgroupDriver`.
    pub driver: String,
    /// Where pods go when kubelet names no cgroup parent: `/sys/fs/cgroup/<parent>/<pod id>`.
    pub parent: String,
    /// Run pods without enforcing resource limits when cgroup v2 is not available (a v1 or
    /// hybrid host). Off by default: limits that cannot be enforced are refused.
    pub allow_unenforced: bool,
}

impl Default for Cgroup {
    fn default() -> Cgroup {
        Cgroup {
            driver: "cgroupfs".to_string(),
            parent: "crius".to_string(),
            allow_unenforced: false,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Runtime {
    /// Named runtime handlers (RuntimeClass handlers) besides the default, empty one:
    /// `[runtime.handlers.NAME]`.
    pub handlers: std::collections::BTreeMap<String, Handler>,
    /// A pause image (e.g. `registry.k8s.io/pause:3.10`) for pods' namespace holders instead of
    /// crius's built-in pause. Pulled on first use with the node's credentials; reported pinned.
    pub sandbox_image: Option<String>,
    /// On a node running SELinux, label every pod that is not privileged, as containerd's
    /// `enable_selinux`: without `selinux_options`, the policy's container label with a pair of
    /// categories of the pod's own. Off, only pods that ask for a label get one.
    pub selinux: bool,
}

/// A runtime handler. It has no settings yet: every handler runs on crius's own runtime.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Handler {}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Registry {
    /// containerd-style per-registry directories holding `hosts.toml`.
    pub config_path: PathBuf,
    /// A docker `config.json` that supplies credentials when a request carries none: the
    /// credential helper it names for the registry (`credHelpers`, `credsStore`), else `auths`.
    pub auth_file: PathBuf,
    /// Layers downloaded and unpacked at the same time, per pull.
    pub max_concurrent_downloads: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Image {
    /// Create character and block devices found in image layers (refused by default).
    pub allow_device_nodes: bool,
    /// The signature policy (containers-policy.json format), read at every pull; without the
    /// file every image is accepted.
    pub signature_policy: PathBuf,
    /// Start containers of eStargz images before their pull ends: each layer is served over
    /// FUSE from its table of contents, chunks fetched on first read and verified, while the
    /// whole pull goes on behind.
    pub lazy_pull: bool,
    /// How long after a lazy pull its whole pull starts, so it does not slow the first
    /// container's start on a small node.
    pub lazy_whole_pull_delay: String,
}

impl Default for Image {
    fn default() -> Image {
        Image {
            allow_device_nodes: false,
            signature_policy: PathBuf::from("/etc/crius/policy.json"),
            lazy_pull: false,
            lazy_whole_pull_delay: "5s".into(),
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            socket: PathBuf::from(DEFAULT_SOCKET),
            root: PathBuf::from("/var/lib/crius"),
            state: PathBuf::from("/run/crius"),
            log_level: "info".to_string(),
            log_format: "text".to_string(),
            registry: Registry::default(),
            image: Image::default(),
            runtime: Runtime::default(),
            cgroup: Cgroup::default(),
            agent: Agent::default(),
            metrics: Metrics::default(),
            network: Network::default(),
            stream: Stream::default(),
            cdi: Cdi::default(),
            nri: Nri::default(),
            checkpoint: Checkpoint::default(),
        }
    }
}

impl Default for Registry {
    fn default() -> Registry {
        Registry {
            config_path: PathBuf::from("/etc/crius/certs.d"),
            auth_file: PathBuf::from("/root/.docker/config.json"),
            max_concurrent_downloads: 3,
        }
    }
}

impl Config {
    /// Loads `path`. A missing file is the default configuration only when `required` is false
    /// (the default path); a file named explicitly must exist.
    pub fn load(path: &Path, required: bool) -> Result<Config, Error> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Config::default());
            }
            Err(source) => {
                return Err(Error::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Config::parse(&text).map_err(|source| Error::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Parses TOML text; the error says where (line and column) and what.
    pub fn parse(text: &str) -> Result<Config, ParseError> {
        let cfg: Config = toml::from_str(text).map_err(|source| ParseError::Toml {
            at: source.span().map(|s| line_col(text, s.start)),
            source: Box::new(source),
        })?;
        let setting = |setting: &'static str, value: &str, must: &'static str| {
            Err(ParseError::Setting {
                setting,
                value: value.to_string(),
                must,
            })
        };
        if !matches!(cfg.cgroup.driver.as_str(), "cgroupfs" | "systemd") {
            return setting(
                "cgroup.driver",
                &cfg.cgroup.driver,
                "must be \"cgroupfs\" or \"systemd\"",
            );
        }
        if cfg.cgroup.parent.is_empty() || cfg.cgroup.parent.split('/').any(|c| c == "..") {
            return setting(
                "cgroup.parent",
                &cfg.cgroup.parent,
                "must be a relative path without \"..\"",
            );
        }
        if humantime::parse_duration(&cfg.stream.stream_idle_timeout).is_err() {
            return setting(
                "stream.stream_idle_timeout",
                &cfg.stream.stream_idle_timeout,
                "is not a duration like \"4h\" or \"30m\"",
            );
        }
        for (key, value) in [
            (
                "nri.plugin_registration_timeout",
                &cfg.nri.plugin_registration_timeout,
            ),
            (
                "nri.plugin_request_timeout",
                &cfg.nri.plugin_request_timeout,
            ),
            (
                "image.lazy_whole_pull_delay",
                &cfg.image.lazy_whole_pull_delay,
            ),
        ] {
            if humantime::parse_duration(value).is_err() {
                return setting(key, value, "is not a duration like \"2s\" or \"500ms\"");
            }
        }
        if humantime::parse_duration(&cfg.stream.token_ttl).is_err() {
            return setting(
                "stream.token_ttl",
                &cfg.stream.token_ttl,
                "is not a duration like \"1m\" or \"30s\"",
            );
        }
        match (&cfg.stream.tls_cert_file, &cfg.stream.tls_key_file) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(ParseError::Rule(
                    "stream.tls_cert_file and stream.tls_key_file go together: give both or neither",
                ));
            }
            (Some(_), Some(_)) if !cfg.stream.tls => {
                return Err(ParseError::Rule(
                    "stream.tls_cert_file and stream.tls_key_file are set but stream.tls is false",
                ));
            }
            _ => {}
        }
        if cfg.stream.address.parse::<std::net::IpAddr>().is_err() {
            return setting(
                "stream.address",
                &cfg.stream.address,
                "is not an IP address",
            );
        }
        if !matches!(cfg.log_format.as_str(), "text" | "json") {
            return setting(
                "log_format",
                &cfg.log_format,
                "must be \"text\" or \"json\"",
            );
        }
        if let Some(a) = &cfg.metrics.address
            && a.parse::<std::net::SocketAddr>().is_err()
        {
            return setting(
                "metrics.address",
                a,
                "must be an IP address and port, like \"127.0.0.1:9090\"",
            );
        }
        if cfg.registry.max_concurrent_downloads == 0 {
            return Err(ParseError::Rule(
                "registry.max_concurrent_downloads must be at least 1",
            ));
        }
        Ok(cfg)
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_tls_files_go_together() {
        let e = Config::parse("[stream]\ntls = true\ntls_cert_file = \"/c\"\n").unwrap_err();
        assert!(e.to_string().contains("tls_key_file"), "{e}");
        let e =
            Config::parse("[stream]\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"\n").unwrap_err();
        assert!(e.to_string().contains("stream.tls is false"), "{e}");
        let e = Config::parse("[stream]\ntoken_ttl = \"soon\"\n").unwrap_err();
        assert!(e.to_string().contains("stream.token_ttl"), "{e}");
        assert!(Config::parse("[stream]\ntls = true\n").is_ok());
    }

    #[test]
    fn log_format_and_metrics_address_are_checked() {
        assert_eq!(
            Config::parse("log_format = \"json\"\n").unwrap().log_format,
            "json"
        );
        let e = Config::parse("log_format = \"yaml\"\n").unwrap_err();
        assert!(e.to_string().contains("log_format"), "{e}");
        let e = Config::parse("[metrics]\naddress = \"localhost\"\n").unwrap_err();
        assert!(e.to_string().contains("metrics.address"), "{e}");
        assert!(Config::parse("[metrics]\naddress = \"[::1]:9090\"\n").is_ok());
    }

    /// The documented defaults are the defaults: uncommenting every `# key = value` line of
    /// `dist/config.toml` changes nothing, and every key is there.
    #[test]
    fn documented_defaults_match() {
        let uncommented: String = super::DEFAULT_TEXT
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(kv) if kv.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ')) => kv,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let parsed = Config::parse(&uncommented).unwrap();
        assert_eq!(format!("{parsed:?}"), format!("{:?}", Config::default()));
        assert!(Config::parse(super::DEFAULT_TEXT).is_ok());
        let keys = uncommented
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(" = "))
            .count();
        // Every plain key of Config (options and handler tables are examples in comments).
        assert_eq!(keys, 39, "{uncommented}");
    }

    use super::*;

    #[test]
    fn empty_file_is_the_default() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(c.root, PathBuf::from("/var/lib/crius"));
        assert_eq!(c.registry.max_concurrent_downloads, 3);
        // Restore through CreateContainer is off unless asked for, as in containerd.
        assert!(!c.checkpoint.restore_from_archive);
        let on = Config::parse("[checkpoint]\nrestore_from_archive = true\n").unwrap();
        assert!(on.checkpoint.restore_from_archive);
    }

    #[test]
    fn keys_override_defaults() {
        let c =
            Config::parse("root = \"/data/crius\"\n[registry]\nconfig_path = \"/x\"\n").unwrap();
        assert_eq!(c.root, PathBuf::from("/data/crius"));
        assert_eq!(c.registry.config_path, PathBuf::from("/x"));
        assert_eq!(c.state, PathBuf::from("/run/crius"));
    }

    #[test]
    fn runtime_handlers() {
        let c = Config::parse("[runtime.handlers.fast]\n[runtime.handlers.other]\n").unwrap();
        assert_eq!(
            c.runtime.handlers.keys().collect::<Vec<_>>(),
            ["fast", "other"]
        );
        assert!(Config::parse("[runtime.handlers.fast]\nengine = \"x\"\n").is_err());
    }

    #[test]
    fn unknown_keys_name_the_line() {
        let e = Config::parse("log_level = \"debug\"\n\nrooot = \"/x\"\n").unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        assert!(e.to_string().contains("rooot"), "{e}");
        let e = Config::parse("[registry]\nmax_concurrent_downloads = \"three\"\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn missing_default_file_is_fine_but_named_file_is_required() {
        let p = Path::new("/nonexistent/crius.toml");
        assert!(Config::load(p, false).is_ok());
        assert!(
            Config::load(p, true)
                .unwrap_err()
                .to_string()
                .contains("/nonexistent/crius.toml")
        );
    }
}
