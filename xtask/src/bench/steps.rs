//! The step profile of crius's container create and start: the `container created` and
//! `container started` lines its daemon logs at debug level (`crius::container::steps`) while
//! the create+start row runs, as rows of their own, numbered in the order the steps run.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::Result;

use super::report::Results;

/// Where the log ends now: the row's lines come after it.
pub fn mark(log: &Path) -> u64 {
    std::fs::metadata(log).map(|m| m.len()).unwrap_or(0)
}

/// Adds a row per step (ms) from the lines logged since `from`.
pub fn add(res: &mut Results, log: &Path, from: u64) -> Result<()> {
    let mut f = std::fs::File::open(log)?;
    f.seek(SeekFrom::Start(from))?;
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    for line in text.lines() {
        let phase = if line.contains("container created") {
            "create"
        } else if line.contains("container started") {
            "start"
        } else {
            continue;
        };
        for (i, (step, us)) in parse(line).into_iter().enumerate() {
            let op = format!("container create+start, {phase} step {i:02}: {step}");
            res.add(&op, "ms", "crius", us / 1000.0);
        }
    }
    Ok(())
}

/// `steps=total=486µs checks=31µs image volumes=1µs ...` into (name, µs) pairs.
fn parse(line: &str) -> Vec<(String, f64)> {
    let Some((_, steps)) = line.split_once(" steps=") else {
        return Vec::new();
    };
    steps
        .split("µs")
        .filter_map(|part| {
            let (name, value) = part.trim().rsplit_once('=')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_steps_of_a_line() {
        let line = "2026-11-28T10:06:06Z DEBUG crius::container::steps: container created \
                    container=\"d7\" steps=total=486µs checks=31µs image volumes=1µs";
        assert_eq!(
            parse(line),
            [
                ("total".to_string(), 486.0),
                ("checks".to_string(), 31.0),
                ("image volumes".to_string(), 1.0)
            ]
        );
    }
}
