//! The `crius` binary: the daemon, the client commands, and the hidden helpers the daemon
//! re-executes. Helpers are dispatched before any tokio runtime exists, so they stay small and
//! single-threaded.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use crius::cli;
use crius::cli::args::{
    AgentFlags, Args, Command, ConfigAction, CriCommand, DaemonFlags, PodCommand,
};
use crius::config::{self, Config};

/// The configuration for client commands: the file if it exists, else the defaults.
fn client_config(path: &std::path::Path) -> Result<Config> {
    let explicit = path != std::path::Path::new(config::DEFAULT_CONFIG);
    Ok(Config::load(path, explicit)?)
}

/// Exits with a remote command's code, or 1 after printing why it failed. Exiting here, not
/// returning, matters: a read of stdin may still be blocked, and returning would wait for it.
fn exit_with(code: cli::Result<i32>) -> ! {
    match code {
        Ok(c) => std::process::exit(c.clamp(0, 255)),
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::exit(1)
        }
    }
}

fn main() -> ExitCode {
    // Helpers the daemon re-executes run first, single-threaded, before clap or any runtime.
    let mut argv = std::env::args_os().skip(1);
    if let (Some(cmd), Some(arg)) = (argv.next(), argv.next()) {
        let helper = match cmd.to_str() {
            Some("monitor") => Some(crius::runtime::monitor::main(std::path::Path::new(&arg))),
            Some("pause") => Some(crius::runtime::pause::main(&arg.to_string_lossy())),
            Some("lazyfs") => Some(crius::snapshot::lazy::main(std::path::Path::new(&arg))),
            _ => None,
        };
        if let Some(code) = helper {
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
    }
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crius: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `crius.1` and a `crius-<command>.1` per visible command.
fn man_pages(dir: &std::path::Path) -> Result<()> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let top = Args::command().name("crius");
    let mut pages = vec![top.clone()];
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages.push(sub.clone().name(format!("crius-{}", sub.get_name())));
    }
    for page in pages {
        let path = dir.join(format!("{}.1", page.get_name()));
        let mut out = Vec::new();
        clap_mangen::Man::new(page)
            .render(&mut out)
            .with_context(|| format!("rendering {}", path.display()))?;
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn socket_of(arg: &Option<String>) -> PathBuf {
    crius::cri::client::socket_path(arg.as_deref().unwrap_or(config::DEFAULT_SOCKET))
}

fn run(args: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let socket = socket_of(&args.socket);
    match args.command {
        Command::Daemon(flags) => daemon(&rt, args.socket.as_deref(), flags),
        Command::Cri(command) => cri_command(&rt, &socket, command),
        Command::Check {
            config: path,
            output,
        } => {
            let cfg = client_config(&path)?;
            std::process::exit(cli::check(&cfg, output));
        }
        Command::Info => Ok(rt.block_on(cli::info(&socket))?),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Args::command(), "crius", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => man_pages(&dir),
        Command::Config {
            action: ConfigAction::Default,
        } => {
            print!("{}", config::DEFAULT_TEXT);
            Ok(())
        }
        Command::Agent(flags) => agent(&rt, args.socket.as_deref(), flags),
        Command::Pods(command) => pod_command(command),
    }
}

/// `crius daemon`: the configuration file with the flags over it, logging, then the daemon.
fn daemon(rt: &tokio::runtime::Runtime, socket: Option<&str>, flags: DaemonFlags) -> Result<()> {
    let DaemonFlags {
        config: path,
        root,
        state,
        log_level,
    } = flags;
    let explicit = path.as_path() != std::path::Path::new(config::DEFAULT_CONFIG);
    let mut cfg = Config::load(&path, explicit)?;
    if let Some(s) = socket {
        cfg.socket = crius::cri::client::socket_path(s);
    }
    if let Some(r) = root {
        cfg.root = r;
    }
    if let Some(s) = state {
        cfg.state = s;
    }
    if let Some(l) = log_level {
        cfg.log_level = l;
    }
    init_logging(&cfg.log_level, &cfg.log_format)?;
    rt.block_on(crius::daemon::run(cfg))?;
    Ok(())
}

/// A client command talking CRI to the runtime at `socket`.
fn cri_command(
    rt: &tokio::runtime::Runtime,
    socket: &std::path::Path,
    command: CriCommand,
) -> Result<()> {
    match command {
        CriCommand::Pull {
            image,
            creds,
            quiet,
        } => Ok(rt.block_on(cli::pull(socket, &image, creds.as_deref(), quiet))?),
        CriCommand::Images {
            image,
            quiet,
            output,
        } => Ok(rt.block_on(cli::images(socket, image.as_deref(), quiet, output))?),
        CriCommand::Rmi { images } => Ok(rt.block_on(cli::remove_images(socket, &images))?),
        CriCommand::Inspecti { image } => Ok(rt.block_on(cli::inspect_image(socket, &image))?),
        CriCommand::Pods {
            name,
            quiet,
            output,
        } => Ok(rt.block_on(cli::pods(socket, name.as_deref(), quiet, output))?),
        CriCommand::Ps {
            all,
            pod,
            quiet,
            output,
        } => Ok(rt.block_on(cli::ps(socket, all, pod.as_deref(), quiet, output))?),
        CriCommand::Exec {
            timeout,
            stdin,
            tty,
            container,
            command,
        } => {
            let code = if stdin || tty {
                rt.block_on(cli::exec_stream(socket, &container, &command, stdin, tty))
            } else {
                rt.block_on(cli::exec(socket, &container, &command, timeout))
            };
            exit_with(code)
        }
        CriCommand::Attach {
            stdin,
            tty,
            container,
        } => exit_with(rt.block_on(cli::attach(socket, &container, stdin, tty))),
        CriCommand::PortForward { pod, ports } => {
            Ok(rt.block_on(cli::forward(socket, &pod, &ports))?)
        }
        CriCommand::Logs {
            follow,
            tail,
            timestamps,
            container,
        } => Ok(rt.block_on(cli::logs(socket, &container, follow, tail, timestamps))?),
        CriCommand::Stop {
            timeout,
            containers,
        } => Ok(rt.block_on(cli::stop(socket, &containers, timeout))?),
        CriCommand::Rm { force, containers } => {
            Ok(rt.block_on(cli::rm(socket, &containers, force))?)
        }
        CriCommand::Stopp { pods } => Ok(rt.block_on(cli::stop_pods(socket, &pods))?),
        CriCommand::Rmp { pods } => Ok(rt.block_on(cli::rm_pods(socket, &pods))?),
        CriCommand::Inspect { container } => Ok(rt.block_on(cli::inspect(socket, &container))?),
        CriCommand::Inspectp { pod } => Ok(rt.block_on(cli::inspect_pod(socket, &pod))?),
        CriCommand::Runp { runtime, config } => {
            Ok(rt.block_on(cli::runp(socket, &config, &runtime))?)
        }
        CriCommand::Create {
            no_pull,
            pod,
            container_config,
            pod_config,
        } => Ok(rt.block_on(cli::create(
            socket,
            &pod,
            &container_config,
            &pod_config,
            no_pull,
        ))?),
        CriCommand::Start { containers } => Ok(rt.block_on(cli::start(socket, &containers))?),
        CriCommand::Stats {
            pod,
            output,
            containers,
        } => Ok(rt.block_on(cli::stats(socket, &containers, pod.as_deref(), output))?),
        CriCommand::Statsp { output, pods } => Ok(rt.block_on(cli::statsp(socket, &pods, output))?),
        CriCommand::Imagefsinfo { output } => Ok(rt.block_on(cli::imagefsinfo(socket, output))?),
        CriCommand::Version => rt.block_on(version(socket)),
    }
}

/// `crius agent`: its settings from the configuration file and the flags, logging, then the
/// agent.
fn agent(rt: &tokio::runtime::Runtime, socket: Option<&str>, flags: AgentFlags) -> Result<()> {
    let AgentFlags {
        config: path,
        manifests,
        state,
        log_dir,
        log_level,
    } = flags;
    let cfg = client_config(&path)?;
    let a = cfg.agent.clone();
    init_logging(
        log_level.as_deref().unwrap_or(&cfg.log_level),
        &cfg.log_format,
    )?;
    let swap_behavior = match a.swap_behavior.as_str() {
        "NoSwap" | "" => crius::frontend::convert::SwapBehavior::NoSwap,
        "LimitedSwap" => crius::frontend::convert::SwapBehavior::LimitedSwap,
        other => anyhow::bail!(
            "{}: agent.swap_behavior {other:?}: NoSwap or LimitedSwap",
            path.display()
        ),
    };
    let socket = match socket {
        Some(s) => crius::cri::client::socket_path(s),
        None => cfg.socket.clone(),
    };
    // Paths go to the runtime (log directories, volumes), which needs them absolute.
    let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    rt.block_on(crius::frontend::agent::run(
        crius::frontend::agent::AgentConfig {
            socket,
            manifests: absolute(manifests.unwrap_or(a.manifests)),
            state: absolute(state.unwrap_or(a.state)),
            log_root: absolute(log_dir.unwrap_or(a.log_dir)),
            swap_behavior,
            seccomp_root: a.seccomp_root,
        },
    ))?;
    Ok(())
}

/// A command on the agent's manifests (`run`, `delete`) or records (`get`, `describe`).
fn pod_command(command: PodCommand) -> Result<()> {
    match command {
        PodCommand::Run {
            config: path,
            manifests,
            files,
        } => {
            let cfg = client_config(&path)?;
            Ok(cli::agent::run(
                &manifests.unwrap_or(cfg.agent.manifests),
                &files,
            )?)
        }
        PodCommand::Get {
            kind: _,
            namespace,
            all_namespaces,
            output,
            config: path,
            state,
        } => {
            let cfg = client_config(&path)?;
            let ns = if all_namespaces {
                None
            } else {
                Some(namespace.unwrap_or_else(|| "default".into()))
            };
            Ok(cli::agent::get_pods(
                &state.unwrap_or(cfg.agent.state),
                ns.as_deref(),
                output,
            )?)
        }
        PodCommand::Describe {
            kind: _,
            name,
            namespace,
            config: path,
            state,
        } => {
            let cfg = client_config(&path)?;
            Ok(cli::agent::describe_pod(
                &state.unwrap_or(cfg.agent.state),
                &namespace,
                &name,
            )?)
        }
        PodCommand::Delete {
            files,
            what,
            namespace,
            config: path,
            manifests,
        } => {
            let cfg = client_config(&path)?;
            let pod = match what.as_slice() {
                [] => None,
                [kind, name] if matches!(kind.as_str(), "pod" | "pods" | "po") => {
                    Some((namespace.as_str(), name.as_str()))
                }
                _ => anyhow::bail!("delete takes -f FILE or `pod NAME`"),
            };
            if files.is_empty() && pod.is_none() {
                anyhow::bail!("delete takes -f FILE or `pod NAME`");
            }
            Ok(cli::agent::delete(
                &manifests.unwrap_or(cfg.agent.manifests),
                &files,
                pod,
            )?)
        }
    }
}

async fn version(socket: &std::path::Path) -> Result<()> {
    println!("Client: crius {}", env!("CARGO_PKG_VERSION"));
    let ch = cli::connect(socket)?;
    let v = crius::cri::client::runtime(ch)
        .version(crius::cri::v1::VersionRequest {
            version: "v1".into(),
        })
        .await
        .map_err(|s| cli::rpc_error("asking the runtime's version", socket, s))?
        .into_inner();
    println!("RuntimeName: {}", v.runtime_name);
    println!("RuntimeVersion: {}", v.runtime_version);
    println!("RuntimeApiVersion: {}", v.runtime_api_version);
    Ok(())
}

fn init_logging(level: &str, format: &str) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .with_context(|| format!("log level {level:?} is not a level or tracing filter"))?;
    use std::io::IsTerminal;
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        logs.json().flatten_event(true).init();
    } else {
        // Colours for a terminal only: journald and log files get plain text.
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
    Ok(())
}
