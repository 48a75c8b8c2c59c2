//! seccomp: the containers' system call filters. It resolves a profile (the built-in
//! RuntimeDefault, or an OCI or Docker-format JSON profile on the node) into the OCI
//! `linux.seccomp` form, compiles that to a BPF program for the x86 ABIs (see `bpf`), and
//! installs a compiled program (through `sys`). Resolution and compilation happen in the daemon
//! once per distinct profile; the container's init only installs the bytes.

pub mod bpf;
mod default;
mod syscalls;

#[cfg(test)]
mod oracle;
#[cfg(test)]
mod props;

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompFilterFlag,
    LinuxSeccompOperator, LinuxSyscall,
};
use serde::Deserialize;

pub use default::runtime_default;

use bpf::{Cond, Decision, Op, Section};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp profile {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("seccomp profile {path}: line {line} column {column}: {detail}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        detail: String,
    },
    #[error("seccomp profile {path}: {field}: {detail}")]
    Field {
        path: PathBuf,
        field: String,
        detail: String,
    },
    #[error("seccomp: {0}")]
    Unsupported(String),
    #[error("seccomp filter needs {len} instructions, more than the kernel's {max}")]
    TooLong { len: usize, max: usize },
}

/// A compiled filter: the program and the `seccomp(2)` flags to install it with.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub program: Vec<libc::sock_filter>,
    pub flags: u32,
}

// Return values (linux/seccomp.h).
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_KILL_THREAD: u32 = 0;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_TRACE: u32 = 0x7ff0_0000;
const RET_LOG: u32 = 0x7ffc_0000;
const RET_ALLOW: u32 = 0x7fff_0000;

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn action(a: LinuxSeccompAction, errno: Option<u32>) -> Result<u32, SeccompError> {
    let data = |d: Option<u32>| d.unwrap_or(libc::EPERM as u32) & 0xffff;
    Ok(match a {
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => RET_KILL_THREAD,
        LinuxSeccompAction::ScmpActKillProcess => RET_KILL_PROCESS,
        LinuxSeccompAction::ScmpActTrap => RET_TRAP,
        LinuxSeccompAction::ScmpActErrno => RET_ERRNO | data(errno),
        LinuxSeccompAction::ScmpActTrace => RET_TRACE | data(errno),
        LinuxSeccompAction::ScmpActLog => RET_LOG,
        LinuxSeccompAction::ScmpActAllow => RET_ALLOW,
        LinuxSeccompAction::ScmpActNotify => {
            return Err(SeccompError::Unsupported(
                "SCMP_ACT_NOTIFY needs a seccomp agent, which crius does not run".into(),
            ));
        }
    })
}

fn op(o: LinuxSeccompOperator) -> Op {
    match o {
        LinuxSeccompOperator::ScmpCmpNe => Op::Ne,
        LinuxSeccompOperator::ScmpCmpLt => Op::Lt,
        LinuxSeccompOperator::ScmpCmpLe => Op::Le,
        LinuxSeccompOperator::ScmpCmpEq => Op::Eq,
        LinuxSeccompOperator::ScmpCmpGe => Op::Ge,
        LinuxSeccompOperator::ScmpCmpGt => Op::Gt,
        LinuxSeccompOperator::ScmpCmpMaskedEq => Op::MaskedEq,
    }
}

/// A system call ABI the filter can cover on this machine.
struct Abi {
    table: &'static [(&'static str, u32)],
}

impl Abi {
    fn number(&self, name: &str) -> Option<u32> {
        self.table
            .binary_search_by(|(n, _)| (*n).cmp(name))
            .ok()
            .map(|i| self.table[i].1)
    }
}

const X86_64: Abi = Abi {
    table: syscalls::X86_64,
};
const X86: Abi = Abi {
    table: syscalls::X86,
};
const X32: Abi = Abi {
    table: syscalls::X32,
};
const AARCH64: Abi = Abi {
    table: syscalls::AARCH64,
};

/// The rules of a profile as (conditions, action) per name, in profile order. Several
/// comparisons of one argument in an entry become separate rules, as runc makes them (a syscall
/// entry cannot AND two comparisons of the same argument through libseccomp).
fn rules(profile: &LinuxSeccomp) -> Result<Vec<(String, Vec<Cond>, u32)>, SeccompError> {
    let mut out = Vec::new();
    for s in profile.syscalls().as_deref().unwrap_or_default() {
        let act = action(s.action(), s.errno_ret())?;
        let mut conds = Vec::new();
        for a in s.args().as_deref().unwrap_or_default() {
            if a.index() > 5 {
                return Err(SeccompError::Unsupported(format!(
                    "argument index {} of {:?} (a system call has six)",
                    a.index(),
                    s.names()
                )));
            }
            conds.push(Cond {
                index: a.index() as u8,
                op: op(a.op()),
                value: a.value(),
                value_two: a.value_two().unwrap_or(0),
            });
        }
        let mut seen = [false; 6];
        let repeated = conds.iter().any(|c| {
            let r = seen[c.index as usize];
            seen[c.index as usize] = true;
            r
        });
        let groups: Vec<Vec<Cond>> = if repeated {
            conds.into_iter().map(|c| vec![c]).collect()
        } else {
            vec![conds]
        };
        for name in s.names() {
            for g in &groups {
                out.push((name.clone(), g.clone(), act));
            }
        }
    }
    Ok(out)
}

/// The decisions for one ABI: each known name's rules in order; the first rule without
/// conditions ends the list and becomes the fallback. Names the ABI lacks are skipped, as
/// libseccomp does (profiles list calls of every architecture).
fn decisions(abi: &Abi, rules: &[(String, Vec<Cond>, u32)], default: u32) -> Vec<(u32, Decision)> {
    let mut by_nr: std::collections::BTreeMap<u32, (Decision, bool)> = Default::default();
    for (name, conds, act) in rules {
        let Some(nr) = abi.number(name) else {
            continue;
        };
        let (d, closed) = by_nr.entry(nr).or_insert((
            Decision {
                rules: vec![],
                fallback: default,
            },
            false,
        ));
        if *closed {
            continue;
        }
        if conds.is_empty() {
            d.fallback = *act;
            *closed = true;
        } else {
            d.rules.push((conds.clone(), *act));
        }
    }
    by_nr
        .into_iter()
        .map(|(nr, (mut d, _))| {
            let fallback = d.fallback;
            d.rules.retain(|(_, a)| *a != fallback);
            (nr, d)
        })
        .filter(|(_, d)| !(d.rules.is_empty() && d.fallback == default))
        .collect()
}

/// Compiles a resolved profile for this machine's ABIs. The native ABI is always covered, the
/// others when listed; a call from an ABI the profile does not cover kills the process.
pub fn compile(profile: &LinuxSeccomp) -> Result<Compiled, SeccompError> {
    compile_for(std::env::consts::ARCH, profile)
}

/// [`compile`] for machine `arch` (`x86_64`: x86_64, and i386 and x32 when listed;
/// `aarch64`: aarch64 alone, 32-bit ARM calls being from an ABI no profile covers here).
fn compile_for(arch: &str, profile: &LinuxSeccomp) -> Result<Compiled, SeccompError> {
    if arch != "x86_64" && arch != "aarch64" {
        return Err(SeccompError::Unsupported(format!(
            "filters are built for x86_64 and aarch64, not {arch}"
        )));
    }
    if profile.listener_path().is_some() {
        return Err(SeccompError::Unsupported(
            "listenerPath: crius does not run seccomp agents".into(),
        ));
    }
    let default = action(profile.default_action(), profile.default_errno_ret())?;
    let arches = profile.architectures().clone().unwrap_or_default();
    let rules = rules(profile)?;
    let bad_arch = RET_KILL_PROCESS;
    let sections = if arch == "aarch64" {
        vec![Section {
            audit_arch: AUDIT_ARCH_AARCH64,
            decisions: decisions(&AARCH64, &rules, default),
            otherwise: default,
            above: None,
        }]
    } else {
        x86_sections(&arches, &rules, default, bad_arch)
    };
    let program = bpf::compile(&sections, bad_arch);
    if program.len() > bpf::MAX_INSNS {
        return Err(SeccompError::TooLong {
            len: program.len(),
            max: bpf::MAX_INSNS,
        });
    }
    let mut flags = 0;
    for f in profile.flags().as_deref().unwrap_or_default() {
        flags |= match f {
            LinuxSeccompFilterFlag::SeccompFilterFlagTsync => 1,
            LinuxSeccompFilterFlag::SeccompFilterFlagLog => 2,
            LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow => 4,
            LinuxSeccompFilterFlag::SeccompFilterFlagWaitKillableRecv => 0,
        };
    }
    Ok(Compiled { program, flags })
}

/// The x86_64 sections: x86_64 itself (with x32 when listed, refused by its bit otherwise),
/// and i386 when listed.
fn x86_sections(
    arches: &[Arch],
    rules: &[(String, Vec<Cond>, u32)],
    default: u32,
    bad_arch: u32,
) -> Vec<Section> {
    let mut native = decisions(&X86_64, rules, default);
    let x32 = arches.contains(&Arch::ScmpArchX32);
    if x32 {
        native.extend(decisions(&X32, rules, default));
    }
    let mut sections = vec![Section {
        audit_arch: AUDIT_ARCH_X86_64,
        decisions: native,
        otherwise: default,
        above: (!x32).then_some((X32_SYSCALL_BIT, bad_arch)),
    }];
    if arches.contains(&Arch::ScmpArchX86) {
        sections.push(Section {
            audit_arch: AUDIT_ARCH_I386,
            decisions: decisions(&X86, rules, default),
            otherwise: default,
            above: None,
        });
    }
    sections
}

// A profile file on the node: the OCI form, plus Docker's extensions (archMap, `name`,
// includes/excludes), which are resolved here so the result is plain OCI.

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProfileFile {
    default_action: String,
    #[serde(default)]
    default_errno_ret: Option<u32>,
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    arch_map: Vec<ArchMapEntry>,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    listener_path: Option<String>,
    #[serde(default)]
    syscalls: Vec<SyscallEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArchMapEntry {
    architecture: String,
    #[serde(default)]
    sub_architectures: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SyscallEntry {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    name: Option<String>,
    action: String,
    #[serde(default)]
    errno_ret: Option<u32>,
    #[serde(default)]
    args: Vec<ArgEntry>,
    #[serde(default)]
    includes: Condition,
    #[serde(default)]
    excludes: Condition,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArgEntry {
    index: usize,
    value: u64,
    #[serde(default)]
    value_two: u64,
    op: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Condition {
    #[serde(default)]
    arches: Vec<String>,
    #[serde(default)]
    caps: Vec<String>,
    #[serde(default)]
    min_kernel: Option<String>,
}

/// The Go name of this machine's architecture, as Docker profiles write it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

/// The running kernel's (major, minor).
fn kernel_version() -> (u32, u32) {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    parse_version(&release).unwrap_or((0, 0))
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

fn cap_name(c: &str) -> String {
    let up = c.to_ascii_uppercase();
    up.strip_prefix("CAP_").unwrap_or(&up).to_string()
}

impl Condition {
    /// Whether an `includes` holds: every listed cap in the bounding set, this arch listed, the
    /// kernel new enough.
    fn includes(&self, bounding: &[String], kernel: (u32, u32)) -> bool {
        (self.arches.is_empty() || self.arches.iter().any(|a| a == go_arch()))
            && self
                .caps
                .iter()
                .all(|c| bounding.iter().any(|b| *b == cap_name(c)))
            && self
                .min_kernel
                .as_deref()
                .and_then(parse_version)
                .is_none_or(|min| kernel >= min)
    }

    /// Whether an `excludes` drops the rule: any listed cap held, this arch listed, the kernel
    /// at least the version.
    fn excludes(&self, bounding: &[String], kernel: (u32, u32)) -> bool {
        self.arches.iter().any(|a| a == go_arch())
            || self
                .caps
                .iter()
                .any(|c| bounding.iter().any(|b| *b == cap_name(c)))
            || self
                .min_kernel
                .as_deref()
                .and_then(parse_version)
                .is_some_and(|min| kernel >= min)
    }
}

fn parse_enum<T: std::str::FromStr>(
    path: &Path,
    field: String,
    value: &str,
) -> Result<T, SeccompError> {
    value.parse().map_err(|_| SeccompError::Field {
        path: path.to_path_buf(),
        field,
        detail: format!("unknown value {value:?}"),
    })
}

/// Reads a profile file from the node and resolves it for a container whose bounding set is
/// `bounding` (capability names without `CAP_`).
pub fn load(path: &Path, bounding: &[String]) -> Result<LinuxSeccomp, SeccompError> {
    let bytes = std::fs::read(path).map_err(|source| SeccompError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &bytes, bounding)
}

pub fn parse(path: &Path, bytes: &[u8], bounding: &[String]) -> Result<LinuxSeccomp, SeccompError> {
    let file: ProfileFile = serde_json::from_slice(bytes).map_err(|e| SeccompError::Parse {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        detail: e.to_string(),
    })?;
    let kernel = kernel_version();
    let mut out = LinuxSeccomp::default();
    out.set_default_action(parse_enum(
        path,
        "defaultAction".into(),
        &file.default_action,
    )?);
    out.set_default_errno_ret(file.default_errno_ret);
    let mut arches = file.architectures.clone();
    if arches.is_empty() {
        let native = native_arch_name();
        if let Some(m) = file.arch_map.iter().find(|m| m.architecture == native) {
            arches.push(m.architecture.clone());
            arches.extend(m.sub_architectures.iter().cloned());
        }
    }
    let arches: Vec<Arch> = arches
        .iter()
        .enumerate()
        .map(|(i, a)| parse_enum(path, format!("architectures[{i}]"), a))
        .collect::<Result<_, _>>()?;
    if !arches.is_empty() {
        out.set_architectures(Some(arches));
    }
    let flags: Vec<LinuxSeccompFilterFlag> = file
        .flags
        .iter()
        .enumerate()
        .map(|(i, f)| parse_enum(path, format!("flags[{i}]"), f))
        .collect::<Result<_, _>>()?;
    if !flags.is_empty() {
        out.set_flags(Some(flags));
    }
    if let Some(l) = &file.listener_path {
        out.set_listener_path(Some(PathBuf::from(l)));
    }
    let mut syscalls = Vec::new();
    for (i, s) in file.syscalls.iter().enumerate() {
        if !s.includes.includes(bounding, kernel) || s.excludes.excludes(bounding, kernel) {
            continue;
        }
        let mut names = s.names.clone();
        names.extend(s.name.iter().cloned());
        if names.is_empty() {
            return Err(SeccompError::Field {
                path: path.to_path_buf(),
                field: format!("syscalls[{i}].names"),
                detail: "no system call named".into(),
            });
        }
        let act: LinuxSeccompAction = parse_enum(path, format!("syscalls[{i}].action"), &s.action)?;
        let mut args = Vec::new();
        for (j, a) in s.args.iter().enumerate() {
            let op: LinuxSeccompOperator =
                parse_enum(path, format!("syscalls[{i}].args[{j}].op"), &a.op)?;
            let mut arg = LinuxSeccompArgBuilder::default()
                .index(a.index)
                .value(a.value)
                .op(op);
            if a.value_two != 0 {
                arg = arg.value_two(a.value_two);
            }
            // Every field has a default, so building cannot fail.
            args.push(arg.build().unwrap_or_default());
        }
        let mut call = LinuxSyscall::default();
        call.set_names(names);
        call.set_action(act);
        call.set_errno_ret(s.errno_ret);
        if !args.is_empty() {
            call.set_args(Some(args));
        }
        syscalls.push(call);
    }
    out.set_syscalls(Some(syscalls));
    // Everything a later compile would refuse, refused now with the file's name.
    compile(&out).map_err(|e| SeccompError::Field {
        path: path.to_path_buf(),
        field: "profile".into(),
        detail: e.to_string(),
    })?;
    Ok(out)
}

fn native_arch_name() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "SCMP_ARCH_X86_64",
        "aarch64" => "SCMP_ARCH_AARCH64",
        _ => "SCMP_ARCH_NATIVE",
    }
}

/// Installs a compiled filter on the calling thread. Without no_new_privs the caller needs
/// CAP_SYS_ADMIN.
pub fn install(program: &[libc::sock_filter], flags: u32) -> std::io::Result<()> {
    crate::sys::seccomp_filter(program, flags)
}

#[cfg(test)]
mod tests {
    use super::bpf::tests::{Data, run};
    use super::*;

    fn caps(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn x86_64(name: &str) -> u32 {
        X86_64.number(name).expect(name)
    }

    fn call(prog: &[libc::sock_filter], name: &str, args: [u64; 6]) -> u32 {
        run(
            prog,
            &Data {
                nr: x86_64(name),
                arch: AUDIT_ARCH_X86_64,
                args,
            },
        )
    }

    const EPERM: u32 = RET_ERRNO | 1;

    #[test]
    fn syscall_tables_are_sorted_and_known() {
        for t in [syscalls::X86_64, syscalls::X86, syscalls::X32] {
            assert!(t.windows(2).all(|w| w[0].0 < w[1].0));
        }
        assert_eq!(x86_64("read"), 0);
        assert_eq!(x86_64("clone3"), 435);
        assert_eq!(X86.number("socketcall"), Some(102));
        assert_eq!(X32.number("read"), Some(X32_SYSCALL_BIT));
    }

    #[test]
    fn aarch64_filters_its_own_numbers() {
        let t = syscalls::AARCH64;
        assert!(t.windows(2).all(|w| w[0].0 < w[1].0));
        // The generic table: no open, no fork, read at 63.
        assert_eq!(AARCH64.number("read"), Some(63));
        assert_eq!(AARCH64.number("openat"), Some(56));
        assert_eq!(AARCH64.number("clone3"), Some(435));
        assert_eq!(AARCH64.number("open"), None);
        let p = runtime_default(&caps(&["CHOWN", "SETUID", "SETGID", "KILL"]));
        let c = compile_for("aarch64", &p).expect("compiles");
        let a64 = |name: &str, args: [u64; 6]| {
            run(
                &c.program,
                &Data {
                    nr: AARCH64.number(name).expect(name),
                    arch: AUDIT_ARCH_AARCH64,
                    args,
                },
            )
        };
        for name in ["read", "openat", "execve", "exit_group", "newfstatat"] {
            assert_eq!(a64(name, [0; 6]), RET_ALLOW, "{name}");
        }
        for name in ["mount", "unshare", "setns", "bpf", "pivot_root", "chroot"] {
            assert_eq!(a64(name, [0; 6]), EPERM, "{name}");
        }
        assert_eq!(a64("clone", [0x11, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(a64("clone", [0x1000_0000, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(a64("clone3", [0; 6]), RET_ERRNO | 38);
        // A call from another ABI (x86_64's read, 32-bit ARM) kills the process.
        for arch in [AUDIT_ARCH_X86_64, 0x4000_0028] {
            let other = run(
                &c.program,
                &Data {
                    nr: 0,
                    arch,
                    args: [0; 6],
                },
            );
            assert_eq!(other, RET_KILL_PROCESS);
        }
        let e = compile_for("riscv64", &p).unwrap_err().to_string();
        assert!(e.contains("riscv64"), "{e}");
    }

    #[test]
    fn runtime_default_allows_common_calls_and_denies_the_dangerous() {
        let p = runtime_default(&caps(&["CHOWN", "SETUID", "SETGID", "KILL", "SYS_CHROOT"]));
        let c = compile(&p).expect("compiles");
        let prog = &c.program;
        assert!(prog.len() < 1000, "{}", prog.len());
        for name in [
            "read",
            "write",
            "openat",
            "execve",
            "exit_group",
            "futex",
            "chroot",
        ] {
            assert_eq!(call(prog, name, [0; 6]), RET_ALLOW, "{name}");
        }
        for name in [
            "mount",
            "unshare",
            "setns",
            "sethostname",
            "kexec_load",
            "bpf",
            "keyctl",
            "pivot_root",
            "reboot",
            "init_module",
            "open_by_handle_at",
            "userfaultfd",
        ] {
            assert_eq!(call(prog, name, [0; 6]), EPERM, "{name}");
        }
        // clone without namespace flags only; clone3 answers ENOSYS so libc falls back.
        assert_eq!(call(prog, "clone", [0x11, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(prog, "clone", [0x1000_0000, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(call(prog, "clone3", [0; 6]), RET_ERRNO | 38);
        // personality: only the listed personas.
        assert_eq!(call(prog, "personality", [8, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            call(prog, "personality", [0xffff_ffff, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(prog, "personality", [0x0040_0000, 0, 0, 0, 0, 0]),
            EPERM
        );
        // socket: AF_INET yes, AF_ALG (38) and AF_VSOCK (40) no, high bits no.
        assert_eq!(call(prog, "socket", [2, 1, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(prog, "socket", [16, 3, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(prog, "socket", [38, 5, 0, 0, 0, 0]), EPERM);
        assert_eq!(call(prog, "socket", [40, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(call(prog, "socket", [0x1_0000_0002, 1, 0, 0, 0, 0]), EPERM);
        // i386 calls are filtered too; x32 is covered.
        let i386_args = |name: &str, args: [u64; 6]| {
            run(
                prog,
                &Data {
                    nr: X86.number(name).expect(name),
                    arch: AUDIT_ARCH_I386,
                    args,
                },
            )
        };
        let i386 = |name: &str| i386_args(name, [0; 6]);
        // socketcall's SYS_SOCKET would reach AF_ALG with its family in memory: refused; its
        // other calls (SYS_CONNECT 3, SYS_SENDMSG 16) pass, and i386's socket(2) is filtered.
        assert_eq!(i386_args("socketcall", [1, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(i386_args("socketcall", [3, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(i386_args("socketcall", [16, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(i386_args("socket", [38, 5, 0, 0, 0, 0]), EPERM);
        assert_eq!(i386_args("socket", [2, 1, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(i386("mount"), EPERM);
        let x32_read = run(
            prog,
            &Data {
                nr: X32.number("read").expect("read"),
                arch: AUDIT_ARCH_X86_64,
                args: [0; 6],
            },
        );
        assert_eq!(x32_read, RET_ALLOW);
    }

    #[test]
    fn capabilities_widen_the_default() {
        let p = runtime_default(&caps(&["SYS_ADMIN", "SYS_TIME", "SYS_PTRACE"]));
        let prog = compile(&p).expect("compiles").program;
        for name in [
            "mount",
            "unshare",
            "setns",
            "sethostname",
            "clone3",
            "settimeofday",
        ] {
            assert_eq!(call(&prog, name, [0; 6]), RET_ALLOW, "{name}");
        }
        assert_eq!(
            call(&prog, "clone", [0x1000_0000, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(call(&prog, "kcmp", [0; 6]), RET_ALLOW);
        assert_eq!(call(&prog, "reboot", [0; 6]), EPERM);
    }

    #[test]
    fn localhost_profiles_oci_and_docker_forms() {
        let oci = br#"{
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [
                {"names": ["sethostname", "setdomainname"], "action": "SCMP_ACT_ERRNO"},
                {"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13},
                {"names": ["kill"], "action": "SCMP_ACT_LOG",
                 "args": [{"index": 1, "value": 9, "op": "SCMP_CMP_EQ"}]}
            ]
        }"#;
        let p = parse(Path::new("block.json"), oci, &[]).expect("parses");
        let prog = compile(&p).expect("compiles").program;
        assert_eq!(call(&prog, "sethostname", [0; 6]), EPERM);
        assert_eq!(call(&prog, "mkdir", [0; 6]), RET_ERRNO | 13);
        assert_eq!(call(&prog, "kill", [1, 9, 0, 0, 0, 0]), RET_LOG);
        assert_eq!(call(&prog, "kill", [1, 15, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(call(&prog, "read", [0; 6]), RET_ALLOW);

        let docker = br#"{
            "defaultAction": "SCMP_ACT_ERRNO",
            "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]}],
            "syscalls": [
                {"name": "read", "action": "SCMP_ACT_ALLOW"},
                {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
                {"names": ["write"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
                {"names": ["uname"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["s390x"]}}
            ]
        }"#;
        let p = parse(Path::new("d.json"), docker, &caps(&["SYS_ADMIN"])).expect("parses");
        let prog = compile(&p).expect("compiles").program;
        assert_eq!(call(&prog, "read", [0; 6]), RET_ALLOW);
        assert_eq!(call(&prog, "mount", [0; 6]), RET_ALLOW);
        assert_eq!(call(&prog, "write", [0; 6]), EPERM);
        assert_eq!(call(&prog, "uname", [0; 6]), EPERM);
        assert_eq!(
            p.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86][..])
        );
    }

    #[test]
    fn bad_profiles_are_named() {
        let e = parse(Path::new("/p/x.json"), b"{\n \"defaultAction\": 3\n}", &[]).unwrap_err();
        assert!(e.to_string().contains("/p/x.json: line 2"), "{e}");
        let e = parse(
            Path::new("x.json"),
            br#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_NOPE"}]}"#,
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("syscalls[0].action"), "{e}");
        let e = parse(
            Path::new("x.json"),
            br#"{"defaultAction": "SCMP_ACT_NOTIFY"}"#,
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("SCMP_ACT_NOTIFY"), "{e}");
        let e = load(Path::new("/nonexistent/profile.json"), &[]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/profile.json"), "{e}");
    }
}
