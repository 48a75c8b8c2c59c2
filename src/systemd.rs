//! systemd: the unit side of the systemd cgroup driver. With `cgroup.driver = "systemd"` every
//! process crius places gets a cgroup that systemd knows about, the way runc's systemd driver
//! does it: a transient scope per container and per pause process (`crius-<id>.scope`,
//! `Delegate=yes`, in the pod's slice), and a transient slice for the pods crius parents itself
//! (`<parent>-<sandbox id>.slice`). Limits go to systemd as unit properties too, so that a
//! `systemctl daemon-reload` re-applies them instead of resetting them; the caller still writes
//! every file itself (systemd has no property for some, `unified` keys among them).
//!
//! It talks to PID 1 through the system bus, as runc does first (systemd's private socket
//! signs its messages with a well-known name where D-Bus wants a unique one, which zbus
//! refuses), with a typed proxy of the manager, and waits for each job's `JobRemoved` signal
//! (subscribed before the job starts) rather than polling. Used by `sandbox` and `container`;
//! uses zbus and nothing else of crius's.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use zbus::{OwnedObjectPath, Variant};

/// The system bus.
pub const SYSTEM_BUS: &str = "/run/dbus/system_bus_socket";

/// Present when systemd is the init system (sd_booted()).
pub const BOOTED_MARKER: &str = "/run/systemd/system";

/// How long a unit's job may take (runc waits 30 s as well).
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// The manager methods and the signal crius uses, typed.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait SystemdManager {
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Variant<'_>)],
        aux: &[(&str, &[(&str, Variant<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn set_unit_properties(
        &self,
        name: &str,
        runtime: bool,
        properties: &[(&str, Variant<'_>)],
    ) -> zbus::Result<()>;

    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    /// Asks systemd to send this client its job signals.
    fn subscribe(&self) -> zbus::Result<()>;

    /// A job ended: `result` is `done`, or why not (`failed`, `timeout`, `canceled`, ...).
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to systemd through the system bus ({SYSTEM_BUS}): {source}")]
    Connect { source: zbus::Error },
    #[error("systemd {method} {unit}: {source}")]
    Call {
        method: &'static str,
        unit: String,
        source: zbus::Error,
    },
    #[error("systemd's job to {what} ended {result:?}")]
    Job { what: String, result: String },
    #[error("systemd did not {what} within {} s", JOB_TIMEOUT.as_secs())]
    Timeout { what: String },
    #[error("{unit}: process {pid} ended before systemd placed it")]
    Gone { unit: String, pid: i32 },
}

/// A connection to systemd, made on first use and made again when systemd re-executes.
#[derive(Default)]
pub struct Manager {
    conn: tokio::sync::Mutex<Option<SystemdManagerProxy<'static>>>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("systemd::Manager")
    }
}

/// A unit property: name and value.
pub type Property = (&'static str, Variant<'static>);

/// A manager call's outcome, as `Error::Call` names it.
fn called<T>(method: &'static str, unit: &str, r: zbus::Result<T>) -> Result<T, Error> {
    r.map_err(|source| Error::Call {
        method,
        unit: unit.to_string(),
        source,
    })
}

impl Manager {
    pub fn new() -> Manager {
        Manager::default()
    }

    /// Connects now (the daemon checks at start that the driver can work).
    pub async fn connect(&self) -> Result<(), Error> {
        self.manager(false).await.map(|_| ())
    }

    /// Whether systemd runs this machine.
    pub fn booted() -> bool {
        Path::new(BOOTED_MARKER).is_dir()
    }

    /// The manager's proxy on a connection subscribed to its job signals.
    async fn manager(&self, fresh: bool) -> Result<SystemdManagerProxy<'static>, Error> {
        let mut slot = self.conn.lock().await;
        if fresh {
            *slot = None;
        }
        if let Some(m) = slot.as_ref() {
            return Ok(m.clone());
        }
        let connect = |source| Error::Connect { source };
        let conn = zbus::connection::Builder::system()
            .build()
            .await
            .map_err(connect)?;
        let m = SystemdManagerProxy::builder(&conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(connect)?;
        m.subscribe().await.map_err(connect)?;
        *slot = Some(m.clone());
        Ok(m)
    }

    /// Runs `call` on the manager; a broken connection (systemd re-executed) is made again once.
    async fn with_manager<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: Fn(SystemdManagerProxy<'static>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        match call(self.manager(false).await?).await {
            Err(Error::Call {
                source: zbus::Error::InputOutput(_),
                ..
            }) => call(self.manager(true).await?).await,
            r => r,
        }
    }

    /// Starts a job with `start` and waits for systemd to report it removed, as runc does:
    /// the signal stream is opened before the job exists, so its end cannot be missed.
    async fn job<F, Fut>(&self, what: &str, start: F) -> Result<(), Error>
    where
        F: Fn(SystemdManagerProxy<'static>) -> Fut,
        Fut: std::future::Future<Output = Result<Option<OwnedObjectPath>, Error>>,
    {
        self.with_manager(|m| {
            let start = &start;
            async move {
                let connect = |source| Error::Connect { source };
                let mut removed = m.receive_job_removed().await.map_err(connect)?;
                let Some(job) = start(m).await? else {
                    return Ok(());
                };
                let deadline = tokio::time::Instant::now() + JOB_TIMEOUT;
                loop {
                    let Ok(next) = tokio::time::timeout_at(deadline, removed.next()).await else {
                        return Err(Error::Timeout { what: what.into() });
                    };
                    let Some(signal) = next else {
                        return Err(Error::Connect {
                            source: zbus::Error::InputOutput(std::sync::Arc::new(
                                std::io::Error::other("the job signal stream ended"),
                            )),
                        });
                    };
                    let Ok(args) = signal.args() else { continue };
                    if args.job == job {
                        return match args.result.as_str() {
                            "done" => Ok(()),
                            other => Err(Error::Job {
                                what: what.into(),
                                result: other.to_string(),
                            }),
                        };
                    }
                }
            }
        })
        .await
    }

    async fn start_transient(&self, unit: &str, props: Vec<Property>) -> Result<(), Error> {
        self.job(&format!("start {unit}"), |m| {
            let props = &props;
            async move {
                let aux: &[(&str, &[(&str, Variant<'_>)])] = &[];
                let r = m.start_transient_unit(unit, "replace", props, aux).await;
                called("StartTransientUnit", unit, r).map(Some)
            }
        })
        .await
    }

    /// Starts `crius-<id>.scope`-style unit `unit` in `slice` holding `pid`, with the cgroup
    /// files `limits` as properties; once its job is done the process is in `cgroup` (its path
    /// relative to the hierarchy's root, as /proc/PID/cgroup shows it), which is checked.
    pub async fn start_scope(
        &self,
        unit: &str,
        slice: &str,
        pid: i32,
        cgroup: &str,
        limits: &[(String, String)],
    ) -> Result<(), Error> {
        let mut props: Vec<Property> = vec![
            ("Description", Variant::from(format!("crius {unit}"))),
            ("Slice", Variant::from(slice.to_string())),
            ("Delegate", Variant::from(true)),
            ("PIDs", Variant::from(vec![pid as u32])),
            ("DefaultDependencies", Variant::from(false)),
        ];
        props.extend(accounting());
        props.extend(properties(limits));
        // An OOM kill inside a container is the container's business (kubelet reads it from
        // the exit); systemd 253+ would otherwise stop the whole scope. Older ones know no
        // OOMPolicy for scopes (and do not act on OOM kills in them).
        let mut with_policy = props.clone();
        with_policy.push(("OOMPolicy", Variant::from("continue".to_string())));
        match self.start_transient(unit, with_policy).await {
            Err(Error::Call {
                source: zbus::Error::MethodError(_, Some(m), _),
                ..
            }) if m.contains("OOMPolicy") => self.start_transient(unit, props).await?,
            r => r?,
        }
        let want = format!("0::/{}", cgroup.trim_start_matches('/'));
        match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
            Ok(s) if s.lines().any(|l| l == want) => Ok(()),
            Ok(s) => Err(Error::Job {
                what: format!("move process {pid} into {unit}"),
                result: format!("done, but the process is in {}", s.trim()),
            }),
            Err(_) => Err(Error::Gone {
                unit: unit.to_string(),
                pid,
            }),
        }
    }

    /// Starts slice `unit` with the cgroup files `limits` as properties; once its job is done
    /// its cgroup directory `dir` is there, which is checked.
    pub async fn start_slice(
        &self,
        unit: &str,
        dir: &Path,
        limits: &[(String, String)],
    ) -> Result<(), Error> {
        let mut props: Vec<Property> = vec![
            ("Description", Variant::from(format!("crius {unit}"))),
            ("DefaultDependencies", Variant::from(false)),
        ];
        props.extend(accounting());
        props.extend(properties(limits));
        self.start_transient(unit, props).await?;
        if dir.join("cgroup.procs").exists() {
            Ok(())
        } else {
            Err(Error::Job {
                what: format!("start {unit}"),
                result: format!("done, but there is no {}", dir.display()),
            })
        }
    }

    /// Gives a running unit new limits (runtime only: nothing is written under /etc).
    pub async fn set_limits(&self, unit: &str, limits: &[(String, String)]) -> Result<(), Error> {
        let props = properties(limits);
        if props.is_empty() {
            return Ok(());
        }
        self.with_manager(|m| {
            let props = &props;
            async move {
                called(
                    "SetUnitProperties",
                    unit,
                    m.set_unit_properties(unit, true, props).await,
                )
            }
        })
        .await
    }

    /// Stops a unit (killing what is left in it), waits for its job to end and forgets a
    /// failed result; a unit systemd no longer knows is already stopped.
    pub async fn stop(&self, unit: &str) -> Result<(), Error> {
        self.job(&format!("stop {unit}"), |m| async move {
            match m.stop_unit(unit, "replace").await {
                Ok(job) => Ok(Some(job)),
                Err(zbus::Error::MethodError(name, ..))
                    if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
                {
                    Ok(None)
                }
                Err(source) => Err(Error::Call {
                    method: "StopUnit",
                    unit: unit.to_string(),
                    source,
                }),
            }
        })
        .await?;
        let _ = self
            .with_manager(|m| async move {
                called("ResetFailedUnit", unit, m.reset_failed_unit(unit).await)
            })
            .await;
        Ok(())
    }
}

fn accounting() -> Vec<Property> {
    [
        "MemoryAccounting",
        "CPUAccounting",
        "TasksAccounting",
        "IOAccounting",
    ]
    .into_iter()
    .map(|p| (p, Variant::from(true)))
    .collect()
}

/// The unit properties that carry these cgroup files (`memory.max` → MemoryMax, and so on).
/// Files without a property (hugetlb, `memory.oom.group`, ...) are only written as files.
pub fn properties(files: &[(String, String)]) -> Vec<Property> {
    let number = |v: &str| -> Option<u64> {
        match v.trim() {
            "max" => Some(u64::MAX),
            n => n.parse().ok(),
        }
    };
    let mut out: Vec<Property> = Vec::new();
    for (file, value) in files {
        let named = match file.as_str() {
            "memory.max" => Some("MemoryMax"),
            "memory.high" => Some("MemoryHigh"),
            "memory.low" => Some("MemoryLow"),
            "memory.min" => Some("MemoryMin"),
            "memory.swap.max" => Some("MemorySwapMax"),
            "pids.max" => Some("TasksMax"),
            "cpu.weight" => Some("CPUWeight"),
            "io.weight" => Some("IOWeight"),
            _ => None,
        };
        if let Some(name) = named {
            if let Some(n) = number(value) {
                out.push((name, Variant::from(n)));
            }
            continue;
        }
        match file.as_str() {
            "cpu.max" => {
                let mut parts = value.split_whitespace();
                let quota = parts.next().unwrap_or("max");
                let period: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(100_000);
                if period == 0 {
                    continue;
                }
                let per_sec = match quota {
                    "max" => u64::MAX,
                    q => match q.parse::<u64>() {
                        // systemd keeps whole 10 ms steps per second, rounding up as runc does.
                        Ok(q) => match q.checked_mul(1_000_000) {
                            Some(us) => us.div_ceil(period).div_ceil(10_000) * 10_000,
                            None => continue,
                        },
                        Err(_) => continue,
                    },
                };
                out.push(("CPUQuotaPeriodUSec", Variant::from(period)));
                out.push(("CPUQuotaPerSecUSec", Variant::from(per_sec)));
            }
            "cpuset.cpus" | "cpuset.mems" => {
                if let Some(mask) = cpu_mask(value) {
                    let name = if file == "cpuset.cpus" {
                        "AllowedCPUs"
                    } else {
                        "AllowedMemoryNodes"
                    };
                    out.push((name, Variant::from(mask)));
                }
            }
            _ => {}
        }
    }
    out
}

/// A cpuset list ("0-2,5") as systemd's bitmask bytes (bit N of byte N/8 for CPU N).
pub fn cpu_mask(list: &str) -> Option<Vec<u8>> {
    let mut mask: Vec<u8> = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<usize>().ok()?,
                b.trim().parse::<usize>().ok()?,
            ),
            None => {
                let n = part.parse::<usize>().ok()?;
                (n, n)
            }
        };
        if lo > hi || hi >= 8192 {
            return None;
        }
        for n in lo..=hi {
            if mask.len() <= n / 8 {
                mask.resize(n / 8 + 1, 0);
            }
            mask[n / 8] |= 1 << (n % 8);
        }
    }
    (!mask.is_empty()).then_some(mask)
}

/// The unit a cgroup directory is (its last component: `crius-<id>.scope`, `x-y.slice`) and the
/// slice it sits in (the one above it); none for a directory that is not a unit's (pods made
/// before crius registered units with systemd).
pub fn unit_and_slice(cgroup: &Path) -> Option<(String, String)> {
    let unit = cgroup.file_name()?.to_str()?.to_string();
    if !(unit.ends_with(".scope") || unit.ends_with(".slice")) {
        return None;
    }
    let slice = cgroup.parent()?.file_name()?.to_str()?;
    slice.ends_with(".slice").then(|| (unit, slice.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_masks_are_systemds_bytes() {
        assert_eq!(cpu_mask("0"), Some(vec![1]));
        assert_eq!(cpu_mask("0-2,9"), Some(vec![0b111, 0b10]));
        assert_eq!(cpu_mask(""), None);
        assert_eq!(cpu_mask("3-1"), None);
        assert_eq!(cpu_mask("x"), None);
    }

    #[test]
    fn files_become_unit_properties() {
        let files: Vec<(String, String)> = [
            ("cpu.weight", "39"),
            ("cpu.max", "50000 100000"),
            ("memory.max", "104857600"),
            ("memory.swap.max", "0"),
            ("pids.max", "max"),
            ("hugetlb.2MB.max", "0"),
            ("cpuset.cpus", "1"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        let props = properties(&files);
        let get = |n: &str| props.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        assert_eq!(get("CPUWeight"), Some(Variant::from(39u64)));
        assert_eq!(get("CPUQuotaPerSecUSec"), Some(Variant::from(500_000u64)));
        assert_eq!(get("CPUQuotaPeriodUSec"), Some(Variant::from(100_000u64)));
        assert_eq!(get("MemoryMax"), Some(Variant::from(104_857_600u64)));
        assert_eq!(get("MemorySwapMax"), Some(Variant::from(0u64)));
        assert_eq!(get("TasksMax"), Some(Variant::from(u64::MAX)));
        assert_eq!(get("AllowedCPUs"), Some(Variant::from(vec![2u8])));
        assert_eq!(props.len(), 7);
    }

    #[test]
    fn units_and_slices_from_paths() {
        let p = Path::new("/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice/crius-abc.scope");
        assert_eq!(
            unit_and_slice(p),
            Some(("crius-abc.scope".into(), "kubepods-pod1.slice".into()))
        );
        assert_eq!(
            unit_and_slice(Path::new("/sys/fs/cgroup/crius.slice/abc")),
            None
        );
        assert_eq!(
            unit_and_slice(Path::new("/sys/fs/cgroup/x/crius-a.scope")),
            None
        );
    }
}
