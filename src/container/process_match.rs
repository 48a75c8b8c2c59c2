//! What a RestorePod config must agree with in its checkpoint: the process it describes is the
//! one checkpointed (`spec.dump`, read as a bounded member of the unpacked archive). A config
//! describes the restored process and cannot change it, so a difference fails the restore,
//! named by field, position or variable name, never by value (arguments and environment may
//! hold secrets). Uses `restore`'s member reading and this module's `Error`.

use std::path::Path;

use super::restore::{bad, read_member};
use super::{Error, invalid};

/// For RestorePod: the new spec's process must be the one checkpointed (`spec.dump` in `dir`):
/// the same arguments, working directory, environment and user. The config describes the
/// restored process; it cannot change it, so a difference fails the restore.
pub(super) fn check_process(
    archive: &Path,
    dir: &Path,
    new: &oci_spec::runtime::Spec,
) -> Result<(), Error> {
    let saved: serde_json::Value = serde_json::from_slice(&read_member(archive, dir, "spec.dump")?)
        .map_err(|e| bad(archive, format!("spec.dump: {e}")))?;
    let new = serde_json::to_value(new.process())
        .map_err(|e| bad(archive, format!("the new spec: {e}")))?;
    let old = &saved["process"];
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|x| x.as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    // Positions and names only: arguments and variables may hold secrets.
    let (was, now) = (strings(&old["args"]), strings(&new["args"]));
    if was != now {
        let at = was.iter().zip(&now).position(|(a, b)| a != b);
        let why = match at {
            Some(i) => format!("argument [{i}] differs from the checkpointed process's"),
            None => format!(
                "{} arguments, the checkpointed process had {}",
                now.len(),
                was.len()
            ),
        };
        return Err(invalid("config.command", why));
    }
    if old["cwd"] != new["cwd"] {
        return Err(invalid(
            "config.working_dir",
            format!(
                "{} is not the checkpointed process's working directory {}",
                shown(&new["cwd"]),
                shown(&old["cwd"])
            ),
        ));
    }
    let vars = |v: &serde_json::Value| -> std::collections::BTreeMap<String, String> {
        strings(v)
            .into_iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (kv, String::new()),
            })
            .collect()
    };
    let (was, now) = (vars(&old["env"]), vars(&new["env"]));
    if let Some(k) = was
        .keys()
        .chain(now.keys())
        .find(|k| was.get(*k) != now.get(*k))
    {
        return Err(invalid(
            "config.envs",
            format!(
                "variable {} differs from the checkpointed process's",
                shown(&serde_json::Value::String(k.clone()))
            ),
        ));
    }
    for key in ["uid", "gid"] {
        if old["user"][key] != new["user"][key] {
            return Err(invalid(
                "config.linux.security_context",
                format!(
                    "the process would run with {key} {}, the checkpointed one ran with {}",
                    new["user"][key], old["user"][key]
                ),
            ));
        }
    }
    Ok(())
}

/// At most 200 bytes of a JSON value, for a message.
fn shown(v: &serde_json::Value) -> String {
    let mut s = v.to_string();
    if s.len() > 200 {
        let mut end = 200;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn message(e: Error) -> String {
        e.to_string()
    }

    #[test]
    fn a_restored_process_must_be_the_checkpointed_one() {
        let d = tempfile::tempdir().unwrap();
        let a = Path::new("/a.tar");
        let spec = |args: &[&str], cwd: &str, env: &[&str], uid: u32| {
            let mut process = oci_spec::runtime::Process::default();
            process.set_args(Some(args.iter().map(|s| s.to_string()).collect()));
            process.set_cwd(cwd.into());
            process.set_env(Some(env.iter().map(|s| s.to_string()).collect()));
            let mut user = oci_spec::runtime::User::default();
            user.set_uid(uid);
            process.set_user(user);
            let mut s = oci_spec::runtime::Spec::default();
            s.set_process(Some(process));
            s
        };
        let saved = spec(&["sh", "-c", "x"], "/", &["PATH=/bin", "TOKEN=secret"], 0);
        std::fs::write(
            d.path().join("spec.dump"),
            serde_json::to_vec(&saved).unwrap(),
        )
        .unwrap();
        check_process(a, d.path(), &saved).unwrap();
        for (new, field) in [
            (
                spec(&["sh", "-c", "y"], "/", &["PATH=/bin", "TOKEN=secret"], 0),
                "config.command",
            ),
            (
                spec(&["sh"], "/", &["PATH=/bin", "TOKEN=secret"], 0),
                "config.command",
            ),
            (
                spec(
                    &["sh", "-c", "x"],
                    "/tmp",
                    &["PATH=/bin", "TOKEN=secret"],
                    0,
                ),
                "config.working_dir",
            ),
            (
                spec(&["sh", "-c", "x"], "/", &["PATH=/bin", "TOKEN=other"], 0),
                "config.envs",
            ),
            (
                spec(
                    &["sh", "-c", "x"],
                    "/",
                    &["PATH=/bin", "TOKEN=secret"],
                    1000,
                ),
                "config.linux",
            ),
        ] {
            let e = message(check_process(a, d.path(), &new).unwrap_err());
            assert!(e.starts_with(field), "{field}: {e}");
            // Names and positions only: values may be secrets.
            assert!(!e.contains("secret") && !e.contains("other"), "{e}");
        }
        std::fs::remove_file(d.path().join("spec.dump")).unwrap();
        let e = message(check_process(a, d.path(), &saved).unwrap_err());
        assert!(e.contains("spec.dump") && e.contains("missing"), "{e}");
    }
}
