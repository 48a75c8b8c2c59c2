//! cdi: the Container Device Interface. Owns the spec files of the configured directories
//! (default `/etc/cdi`, then `/var/run/cdi`; a later directory wins, two files of one directory
//! defining the same device is a conflict that makes the device unusable), their parsing and
//! checks (`spec`), the resolution of fully qualified device names (`vendor.com/class=name`)
//! into container edits, and applying those edits to an OCI runtime spec (`edits`). Files are
//! read again when they change (size or modification time), so a driver that writes a spec
//! into `/var/run/cdi` is seen at the next container that asks. Synchronous; uses `oci-spec`,
//! serde and the file system, nothing of crius above it.

pub mod edits;
pub mod spec;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use oci_spec::runtime::Spec as OciSpec;

pub use spec::{Spec, SpecError};

/// The directories of a default configuration, lowest priority first.
pub fn default_dirs() -> Vec<PathBuf> {
    vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("CDI device {device:?}: {reason}")]
    Name {
        device: String,
        reason: spec::NameError,
    },
    #[error("unknown CDI device {device}: no spec file in {dirs} defines it{unreadable}")]
    Unknown {
        device: String,
        dirs: String,
        /// The files that could not be read, said because one of them may be the one meant.
        unreadable: String,
    },
    #[error("CDI device {device}: its spec file {file} is invalid: {reason}")]
    InvalidFile {
        device: String,
        file: PathBuf,
        reason: String,
    },
    #[error(
        "CDI device {device} is defined by both {first} and {second}, in one directory; \
         remove one"
    )]
    Conflict {
        device: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("CDI device {device} from {file}: {reason}")]
    Edit {
        device: String,
        file: PathBuf,
        reason: String,
    },
}

impl Error {
    /// The device the error is about.
    pub fn device(&self) -> &str {
        match self {
            Error::Name { device, .. }
            | Error::Unknown { device, .. }
            | Error::InvalidFile { device, .. }
            | Error::Conflict { device, .. }
            | Error::Edit { device, .. } => device,
        }
    }
}

/// One spec file as read: its spec, or why it cannot be used (with the kind it claims, when
/// that much could be read).
#[derive(Debug, Clone)]
pub struct SpecFile {
    pub path: PathBuf,
    /// The index of its directory: higher wins.
    pub priority: usize,
    pub spec: Result<Arc<Spec>, (Option<String>, SpecError)>,
}

#[derive(Debug, Clone)]
struct Cached {
    modified: Option<SystemTime>,
    len: u64,
    spec: Result<Arc<Spec>, (Option<String>, SpecError)>,
}

/// The spec directories and what was last read from them.
#[derive(Debug)]
pub struct Registry {
    dirs: Vec<PathBuf>,
    cache: Mutex<HashMap<PathBuf, Cached>>,
}

/// The spec directories' contents, for `crius check`.
#[derive(Debug, Clone, Default)]
pub struct Survey {
    pub devices: Vec<(String, PathBuf)>,
    pub conflicts: Vec<(String, PathBuf, PathBuf)>,
    pub invalid: Vec<(PathBuf, String)>,
}

/// A resolved device: the file that defines it and its spec.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub device: String,
    pub file: PathBuf,
    pub spec: Arc<Spec>,
}

/// Why a spec file is not to be trusted: owned by someone other than root (or this process's
/// own user), or writable by its group or by others.
fn unsafe_file(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Some(format!(
            "owned by user {}, not root: its hooks would run as root",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Some(format!(
            "mode {:o} lets others write it: its hooks would run as root",
            meta.mode() & 0o7777
        ));
    }
    None
}

/// The kind a file claims, read loosely from a file that does not pass the checks.
fn claimed_kind(path: &Path, text: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Loose {
        kind: Option<String>,
    }
    let loose: Option<Loose> = if path.extension().is_some_and(|e| e == "yaml") {
        serde_saphyr::from_str(text).ok()
    } else {
        serde_json::from_str(text).ok()
    };
    loose.and_then(|l| l.kind)
}

impl Registry {
    pub fn new(dirs: Vec<PathBuf>) -> Registry {
        Registry {
            dirs,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Every `.json` and `.yaml` file of the directories, in priority order (lowest first, by
    /// name within a directory), read again where it changed since the last scan.
    pub fn scan(&self) -> Vec<SpecFile> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for (priority, dir) in self.dirs.iter().enumerate() {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml"))
                .collect();
            paths.sort();
            for path in paths {
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                if !meta.is_file() {
                    continue;
                }
                let modified = meta.modified().ok();
                let fresh = cache
                    .get(&path)
                    .is_some_and(|c| c.modified == modified && c.len == meta.len());
                if let Some(why) = unsafe_file(&meta) {
                    // Hooks run as root: a spec anyone else may write is not one to trust.
                    out.push(SpecFile {
                        path: path.clone(),
                        priority,
                        spec: Err((None, SpecError::Unsafe(why))),
                    });
                    seen.push(path);
                    continue;
                }
                if !fresh {
                    let spec = match std::fs::read_to_string(&path) {
                        Ok(text) => spec::parse(&path, &text)
                            .map(Arc::new)
                            .map_err(|e| (claimed_kind(&path, &text), e)),
                        Err(e) => Err((None, SpecError::Syntax(e.to_string()))),
                    };
                    cache.insert(
                        path.clone(),
                        Cached {
                            modified,
                            len: meta.len(),
                            spec,
                        },
                    );
                }
                if let Some(c) = cache.get(&path) {
                    out.push(SpecFile {
                        path: path.clone(),
                        priority,
                        spec: c.spec.clone(),
                    });
                }
                seen.push(path);
            }
        }
        cache.retain(|p, _| seen.contains(p));
        out
    }

    /// What the directories hold now: every usable device with its file (the winning one),
    /// the devices two files of one priority define, and the files that cannot be used.
    pub fn survey(&self) -> Survey {
        let files = self.scan();
        let mut out = Survey::default();
        let mut names: Vec<(&str, &str)> = Vec::new();
        for f in &files {
            match &f.spec {
                Ok(s) => {
                    for d in &s.devices {
                        if !names.contains(&(s.kind.as_str(), d.name.as_str())) {
                            names.push((&s.kind, &d.name));
                        }
                    }
                }
                Err((_, e)) => out.invalid.push((f.path.clone(), e.to_string())),
            }
        }
        for (kind, name) in names {
            let device = format!("{kind}={name}");
            match defining(&files, kind, name) {
                Ok(Some((f, _))) => out.devices.push((device, f.path.clone())),
                Ok(None) => {}
                Err((first, second)) => out.conflicts.push((device, first, second)),
            }
        }
        out
    }

    /// The files defining each requested device, in request order (each device once).
    pub fn resolve(&self, devices: &[String]) -> Result<Vec<Resolved>, Error> {
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        let files = self.scan();
        let mut out: Vec<Resolved> = Vec::new();
        for device in devices {
            if out.iter().any(|r| &r.device == device) {
                continue;
            }
            let (kind, name) = spec::parse_qualified(device).map_err(|reason| Error::Name {
                device: device.clone(),
                reason,
            })?;
            let found =
                defining(&files, kind, name).map_err(|(first, second)| Error::Conflict {
                    device: device.clone(),
                    first,
                    second,
                })?;
            let Some((f, s)) = found else {
                if let Some(bad) = files.iter().find_map(|f| match &f.spec {
                    Err((Some(k), e)) if k == kind => Some((f, e)),
                    _ => None,
                }) {
                    return Err(Error::InvalidFile {
                        device: device.clone(),
                        file: bad.0.path.clone(),
                        reason: bad.1.to_string(),
                    });
                }
                let unreadable: Vec<String> = files
                    .iter()
                    .filter_map(|f| match &f.spec {
                        Err((_, e)) => Some(format!("{}: {e}", f.path.display())),
                        Ok(_) => None,
                    })
                    .collect();
                return Err(Error::Unknown {
                    device: device.clone(),
                    dirs: self
                        .dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    unreadable: if unreadable.is_empty() {
                        String::new()
                    } else {
                        format!(" (files that could not be read: {})", unreadable.join("; "))
                    },
                });
            };
            out.push(Resolved {
                device: device.clone(),
                file: f.path.clone(),
                spec: s.clone(),
            });
        }
        Ok(out)
    }

    /// Resolves the devices and applies their edits to the spec: each spec file's own edits
    /// once, when the first of its devices is met, then the device's.
    pub fn inject(&self, oci: &mut OciSpec, devices: &[String]) -> Result<(), Error> {
        let resolved = self.resolve(devices)?;
        let mut applied: Vec<&Path> = Vec::new();
        for r in &resolved {
            let fail = |e: edits::EditError| Error::Edit {
                device: r.device.clone(),
                file: r.file.clone(),
                reason: e.0,
            };
            if !applied.contains(&r.file.as_path()) {
                applied.push(&r.file);
                edits::apply(oci, &r.spec.container_edits).map_err(fail)?;
            }
            let name = r.device.split_once('=').map_or("", |(_, n)| n);
            if let Some(d) = r.spec.devices.iter().find(|d| d.name == name) {
                edits::apply(oci, &d.container_edits).map_err(fail)?;
            }
        }
        Ok(())
    }
}

/// A file that defines a device, with its spec.
type Definer<'a> = (&'a SpecFile, &'a Arc<Spec>);

/// The file of the highest priority that defines `kind`'s device `name` (files come lowest
/// priority first); two of one priority are a conflict, named by their paths.
fn defining<'a>(
    files: &'a [SpecFile],
    kind: &str,
    name: &str,
) -> Result<Option<Definer<'a>>, (PathBuf, PathBuf)> {
    let mut found: Option<Definer<'a>> = None;
    for f in files {
        let Ok(s) = &f.spec else { continue };
        if s.kind != kind || !s.devices.iter().any(|d| d.name == name) {
            continue;
        }
        match found {
            Some((prev, _)) if prev.priority == f.priority => {
                return Err((prev.path.clone(), f.path.clone()));
            }
            _ => found = Some((f, s)),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    fn spec(kind: &str, devices: &[&str], env: &str) -> String {
        let devs: Vec<String> = devices
            .iter()
            .map(|d| format!(r#"{{"name":"{d}","containerEdits":{{"env":["DEV={d}"]}}}}"#))
            .collect();
        format!(
            r#"{{"cdiVersion":"0.6.0","kind":"{kind}","devices":[{}],"containerEdits":{{"env":["{env}"]}}}}"#,
            devs.join(",")
        )
    }

    #[test]
    fn later_directories_win_and_one_directory_conflicts() {
        let t = tempfile_dir();
        let (etc, run) = (t.join("etc"), t.join("run"));
        write(&etc, "a.json", &spec("v.com/gpu", &["0", "1"], "FROM=etc"));
        write(&run, "b.json", &spec("v.com/gpu", &["1"], "FROM=run"));
        let r = Registry::new(vec![etc.clone(), run.clone()]);
        let got = r
            .resolve(&["v.com/gpu=1".into(), "v.com/gpu=0".into()])
            .unwrap();
        assert_eq!(got[0].file, run.join("b.json"));
        assert_eq!(got[1].file, etc.join("a.json"));
        write(
            &run,
            "c.yaml",
            "cdiVersion: 0.5.0\nkind: v.com/gpu\ndevices:\n  - name: \"1\"\n",
        );
        let e = r.resolve(&["v.com/gpu=1".into()]).unwrap_err();
        assert!(matches!(e, Error::Conflict { .. }), "{e}");
        std::fs::remove_file(run.join("c.yaml")).unwrap();
        r.resolve(&["v.com/gpu=1".into()]).unwrap();
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn unknown_and_invalid_are_named() {
        let t = tempfile_dir();
        write(&t, "good.json", &spec("v.com/gpu", &["0"], "A=1"));
        write(
            &t,
            "bad.json",
            r#"{"cdiVersion":"0.6.0","kind":"w.com/fpga","devices":[]}"#,
        );
        write(&t, "ignored.txt", "not a spec");
        let r = Registry::new(vec![t.clone()]);
        let e = r.resolve(&["w.com/fpga=0".into()]).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidFile { file, .. } if file.ends_with("bad.json")),
            "{e}"
        );
        let e = r.resolve(&["v.com/gpu=9".into()]).unwrap_err().to_string();
        assert!(e.contains("v.com/gpu=9") && e.contains("bad.json"), "{e}");
        let e = r.resolve(&["gpu9".into()]).unwrap_err();
        assert!(matches!(e, Error::Name { .. }), "{e}");
        // A file others may write is not trusted.
        write(&t, "open.json", &spec("x.com/open", &["0"], "C=3"));
        std::fs::set_permissions(
            t.join("open.json"),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .unwrap();
        let e = r.resolve(&["x.com/open=0".into()]).unwrap_err().to_string();
        assert!(e.contains("open.json") && e.contains("others"), "{e}");
        // A fixed file is read again.
        write(&t, "bad.json", &spec("w.com/fpga", &["0"], "B=2"));
        r.resolve(&["w.com/fpga=0".into()]).unwrap();
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn survey_lists_devices_conflicts_and_bad_files() {
        let t = tempfile_dir();
        let (a, b) = (t.join("a"), t.join("b"));
        write(&a, "one.json", &spec("v.com/gpu", &["0", "1"], "A=1"));
        write(&a, "two.json", &spec("v.com/gpu", &["1"], "A=2"));
        write(&b, "three.json", &spec("v.com/gpu", &["0"], "A=3"));
        write(&b, "bad.yaml", "cdiVersion: 9\n");
        let s = Registry::new(vec![a.clone(), b.clone()]).survey();
        assert_eq!(
            s.devices,
            [("v.com/gpu=0".to_string(), b.join("three.json"))]
        );
        assert_eq!(s.conflicts.len(), 1);
        assert_eq!(s.conflicts[0].0, "v.com/gpu=1");
        assert_eq!(s.invalid.len(), 1);
        assert!(s.invalid[0].0.ends_with("bad.yaml"));
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn spec_edits_once_then_each_device() {
        let t = tempfile_dir();
        write(&t, "a.json", &spec("v.com/gpu", &["0", "1"], "SHARED=1"));
        let r = Registry::new(vec![t.clone()]);
        let mut oci = oci_spec::runtime::Spec::default();
        oci.set_mounts(Some(Vec::new()));
        r.inject(&mut oci, &["v.com/gpu=0".into(), "v.com/gpu=1".into()])
            .unwrap();
        let env = oci.process().as_ref().unwrap().env().clone().unwrap();
        assert_eq!(env.iter().filter(|e| e.starts_with("SHARED=")).count(), 1);
        assert!(env.contains(&"DEV=1".to_string()), "{env:?}");
        std::fs::remove_dir_all(&t).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "crius-cdi-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}
