//! Project tasks: `cargo xtask lint | unit | integration | test | ci | bench`.

mod bench;

use std::process::Command;

use anyhow::{Context, Result, bail};

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn lint() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))
}

fn unit() -> Result<()> {
    run(cargo().args(["test", "--workspace", "--lib", "--bins"]))
}

/// The effective uid as the kernel reports it.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn integration() -> Result<()> {
    if !is_root() {
        bail!("integration tests need root (they mount overlayfs and create namespaces)");
    }
    run(cargo().args(["test", "--test", "*"]))
}

fn bench(args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("the benchmark needs root (it runs two container runtimes)");
    }
    let opts = bench::Options::parse(args)?;
    run(cargo().args(["build", "--release", "--bin", "crius"]))?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(bench::run(opts))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().cloned().unwrap_or_default();
    match task.as_str() {
        "lint" => lint(),
        "unit" => unit(),
        "integration" => integration(),
        "test" => {
            unit()?;
            integration()
        }
        "ci" => {
            lint()?;
            unit()?;
            integration()?;
            bench(&["--smoke".to_string()])
        }
        "bench" => bench(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <task>");
            eprintln!("  lint         rustfmt --check and clippy -D warnings");
            eprintln!("  unit         unit tests (no root)");
            eprintln!(
                "  integration  root tests against a real registry, overlayfs and namespaces"
            );
            eprintln!("  test         unit + integration");
            eprintln!(
                "  bench        crius against containerd, side by side [--rounds N] [--smoke]"
            );
            eprintln!(
                "               [--large-mb MB] [--concurrent N] [--idle-seconds S] [--out FILE]"
            );
            eprintln!("  ci           everything CI runs (the benchmark as a smoke run)");
            bail!("unknown task {task:?}")
        }
    }
}
