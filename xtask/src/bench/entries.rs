//! The many-entries row: each round pushes an image of one gzip layer holding 32,000 small
//! files in one directory (the shape with which 2026's advisory replay found crius's unpack
//! slower than containerd's), and each runtime pulls it cold, on a quiet disk. Its unpack
//! dominates: the layer is a few MiB.

use anyhow::{Result, bail};

use super::Rt;
use super::images::{self, Registry};
use super::report::Results;

/// Files in the layer.
pub const ENTRIES: usize = 32_000;

/// The row's name, which carries the layer's shape.
pub fn label() -> String {
    format!("cold pull, one layer of {ENTRIES} files in one directory")
}

/// One image per round, so no pull finds the last round's layer.
pub async fn build(registry: &Registry, rounds: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for r in 0..rounds {
        let layer = images::gzip_layer(images::one_directory_tar(ENTRIES, r as u64 + 7)?)?;
        let img = images::image(vec![layer], &["sh"]);
        out.push(registry.push("entries", &format!("r{r}"), &img).await?);
    }
    Ok(out)
}

/// Each runtime pulls the round's image cold, the last pull's dirty pages written out first.
pub async fn pull_rows(
    rts: &mut [Rt],
    order: &[usize],
    reference: &str,
    res: &mut Results,
) -> Result<()> {
    for &i in order {
        let rt = &mut rts[i];
        if !std::process::Command::new("sync").status()?.success() {
            bail!("sync failed");
        }
        let (_, ms) = super::timed(rt.pull(reference)).await?;
        res.add(&label(), "ms", rt.name(), ms);
    }
    Ok(())
}
