//! The command line of the `crius` binary, as clap definitions: the daemon, the client commands,
//! the agent's commands and the package's helpers (completions, man pages). Here rather than in
//! `main` so the docs' test can list every command (`clap::CommandFactory`). Uses `config` for
//! the default file and `cli`'s output formats.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::Output;
use crate::config::DEFAULT_CONFIG;

#[derive(Parser)]
#[command(
    name = "crius",
    version,
    about = "A small, fast Kubernetes node runtime (CRI over Linux primitives)"
)]
pub struct Args {
    /// The CRI socket of the runtime to talk to (clients) or serve on (daemon).
    #[arg(long, global = true, env = "CRIUS_SOCKET")]
    pub socket: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum ConfigAction {
    /// Print every key with its default value and what it does.
    Default,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the CRI daemon.
    Daemon(DaemonFlags),
    #[command(flatten)]
    Cri(CriCommand),
    /// Check this node for what crius needs (ok/warn/fail per item; exit code by the worst).
    Check {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The running runtime's conditions, features, versions and configuration.
    Info,
    /// Print shell completions (bash, zsh, fish, ...) for the package.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Write man pages (crius.1 and one per command) into a directory, for the package.
    #[command(hide = true)]
    Man { dir: PathBuf },
    /// The daemon's configuration.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Run the pod agent: the pods of a manifest directory, kept running through CRI.
    Agent(AgentFlags),
    #[command(flatten)]
    Pods(PodCommand),
}

// The flags of `crius daemon` (no doc comment: the command's help is its variant's).
#[derive(clap::Args)]
pub struct DaemonFlags {
    /// Configuration file (TOML; every key optional).
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Persistent data directory (images, records).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Runtime state directory (namespace handles, mounts).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// error, warn, info, debug, trace, or a tracing filter.
    #[arg(long)]
    pub log_level: Option<String>,
}

/// The client commands that talk CRI to the runtime (images, pods, containers, stats).
#[derive(Subcommand)]
pub enum CriCommand {
    /// Pull an image.
    Pull {
        image: String,
        /// Registry credentials.
        #[arg(long, value_name = "USER:PASS")]
        creds: Option<String>,
        /// No progress bar.
        #[arg(short, long)]
        quiet: bool,
    },
    /// List images.
    Images {
        /// Only this image.
        image: Option<String>,
        /// Only image IDs.
        #[arg(short, long)]
        quiet: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Remove images (all their tags).
    Rmi {
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Show an image's status and config as JSON.
    Inspecti { image: String },
    /// List pod sandboxes.
    Pods {
        /// Only pods whose name contains this.
        #[arg(long)]
        name: Option<String>,
        #[arg(short, long)]
        quiet: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// List containers (running ones unless -a).
    Ps {
        #[arg(short, long)]
        all: bool,
        /// Only containers of this pod.
        #[arg(short, long)]
        pod: Option<String>,
        #[arg(short, long)]
        quiet: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Run a command in a running container.
    Exec {
        /// Seconds before the command is killed (0: no limit; not with -i or -t).
        #[arg(long, default_value_t = 0)]
        timeout: i64,
        /// Pass stdin to the command (through the streaming server).
        #[arg(short = 'i', long)]
        stdin: bool,
        /// Give the command a terminal (through the streaming server).
        #[arg(short, long)]
        tty: bool,
        container: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Attach to a running container's own stdin, stdout and stderr.
    Attach {
        /// Pass stdin to the container (it must have been created with stdin).
        #[arg(short = 'i', long)]
        stdin: bool,
        /// The container has a terminal.
        #[arg(short, long)]
        tty: bool,
        container: String,
    },
    /// Forward local ports to a pod: LOCAL:REMOTE, or PORT for the same number; until Ctrl-C.
    PortForward {
        pod: String,
        #[arg(required = true)]
        ports: Vec<String>,
    },
    /// Print a container's log.
    Logs {
        /// Keep printing new lines until the container exits.
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines.
        #[arg(long)]
        tail: Option<usize>,
        /// Show the timestamps.
        #[arg(short, long)]
        timestamps: bool,
        container: String,
    },
    /// Stop containers.
    Stop {
        /// Seconds to wait after the stop signal before SIGKILL.
        #[arg(short, long, default_value_t = 10)]
        timeout: i64,
        #[arg(required = true)]
        containers: Vec<String>,
    },
    /// Remove containers.
    Rm {
        /// Remove running containers too (they are killed).
        #[arg(short, long)]
        force: bool,
        #[arg(required = true)]
        containers: Vec<String>,
    },
    /// Stop pod sandboxes (their containers are killed).
    Stopp {
        #[arg(required = true)]
        pods: Vec<String>,
    },
    /// Remove pod sandboxes and everything in them.
    Rmp {
        #[arg(required = true)]
        pods: Vec<String>,
    },
    /// Show a container's status and runtime spec as JSON.
    Inspect { container: String },
    /// Show a pod sandbox's status as JSON.
    Inspectp { pod: String },
    /// Run a pod sandbox from a PodSandboxConfig file (JSON, or YAML named .yaml); prints its ID.
    Runp {
        /// The runtime handler (RuntimeClass) to run it with.
        #[arg(short, long, default_value = "")]
        runtime: String,
        config: PathBuf,
    },
    /// Create a container in a pod from a ContainerConfig file and the pod's config file,
    /// pulling its image first if it is missing; prints its ID.
    Create {
        /// Do not pull the image.
        #[arg(long)]
        no_pull: bool,
        pod: String,
        container_config: PathBuf,
        pod_config: PathBuf,
    },
    /// Start created containers.
    Start {
        #[arg(required = true)]
        containers: Vec<String>,
    },
    /// Show running containers' CPU, memory and writable layer.
    Stats {
        /// Only containers of this pod.
        #[arg(short, long)]
        pod: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
        containers: Vec<String>,
    },
    /// Show pods' CPU, memory, network and processes.
    Statsp {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
        pods: Vec<String>,
    },
    /// Show the image filesystem's usage.
    Imagefsinfo {
        #[arg(short, long, value_enum, default_value = "json")]
        output: Output,
    },
    /// Show the runtime's name and versions.
    Version,
}

// The flags of `crius agent` (no doc comment: the command's help is its variant's).
#[derive(clap::Args)]
pub struct AgentFlags {
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// The manifest directory to watch.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// The agent's state directory (records, volumes).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Where container logs go.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    #[arg(long)]
    pub log_level: Option<String>,
}

/// The commands on the agent's pods: their manifests (`run`, `delete`) and records (`get`,
/// `describe`).
#[derive(Subcommand)]
pub enum PodCommand {
    /// Check Pod, Secret and ConfigMap manifests and hand them to the agent.
    Run {
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        #[arg(long)]
        manifests: Option<PathBuf>,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// List the agent's pods.
    Get {
        /// What to list: pods.
        #[arg(value_parser = ["pods", "pod", "po"])]
        kind: String,
        #[arg(short, long)]
        namespace: Option<String>,
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        #[arg(long)]
        state: Option<PathBuf>,
    },
    /// Show one of the agent's pods: containers, probes, events.
    Describe {
        #[arg(value_parser = ["pod", "pods", "po"])]
        kind: String,
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        #[arg(long)]
        state: Option<PathBuf>,
    },
    /// Take manifests away from the agent (their pods stop).
    Delete {
        /// The manifest files given to `run`.
        #[arg(short = 'f', long = "filename")]
        files: Vec<PathBuf>,
        /// `pod NAME`: the manifest holding that pod.
        #[arg(num_args = 0..=2)]
        what: Vec<String>,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        #[arg(long, default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        #[arg(long)]
        manifests: Option<PathBuf>,
    },
}
