//! Project tasks: `cargo xtask lint | test | ci`.

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

fn integration() -> Result<()> {
    if !is_root() {
        bail!("integration tests need root (they mount overlayfs and create namespaces)");
    }
    run(cargo().args(["test", "--test", "*"]))
}

fn is_root() -> bool {
    // The effective uid as the kernel reports it (no libc needed here).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
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
            integration()
        }
        _ => {
            eprintln!("usage: cargo xtask <lint|unit|integration|test|ci>");
            eprintln!("  lint         rustfmt --check and clippy -D warnings");
            eprintln!("  unit         unit tests (no root)");
            eprintln!(
                "  integration  root tests against a real registry, overlayfs and namespaces"
            );
            eprintln!("  test         unit + integration");
            eprintln!("  ci           everything CI runs");
            bail!("unknown task {task:?}")
        }
    }
}
