//! `cargo xtask arch`: draws `docs/architecture.svg` from the code: the top-level modules of
//! `src/` in rows with an arrow for each dependency between them, and the daemon with the
//! helpers `src/main.rs` dispatches. Its unit test draws it again from the tree and fails
//! when the committed picture is not what the code gives, so the picture cannot go stale.

mod draw;
mod source;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The picture, under the repository.
const PICTURE: &str = "docs/architecture.svg";

/// The repository: xtask's parent, wherever cargo is run from.
fn repository() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

/// The picture the tree under `root` gives.
fn picture(root: &Path) -> Result<String> {
    let tree = source::read(root)?;
    draw::svg(&tree)
}

/// Writes the picture and says where.
pub fn write() -> Result<()> {
    let root = repository();
    let svg = picture(&root)?;
    let path = root.join(PICTURE);
    std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
    println!("xtask: wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_architecture_drawing_is_what_the_code_gives() {
        let root = repository();
        let drawn = picture(&root).unwrap_or_else(|e| panic!("drawing {PICTURE}: {e:#}"));
        let committed = std::fs::read_to_string(root.join(PICTURE)).unwrap_or_default();
        // The first label that differs says what changed better than the first line (the
        // picture's height), which is said only when every label is the same.
        let first = |labels: bool| {
            let keep = |l: &&str| !labels || !l.starts_with('<');
            drawn
                .lines()
                .filter(keep)
                .zip(committed.lines().filter(keep).chain(std::iter::repeat("")))
                .find(|(a, b)| a != b)
                .map(|(now, was)| format!("{was:?} drawn as {now:?}"))
        };
        let differs = first(true).or_else(|| first(false)).unwrap_or_default();
        assert!(
            drawn == committed,
            "{PICTURE} is not what the code gives (the modules, their uses or the helpers \
             changed; first {differs}): run cargo xtask arch and commit it"
        );
    }
}
