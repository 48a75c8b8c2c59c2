//! The device controller, so a container opens only its own devices: on cgroup v2 an eBPF
//! program (BPF_PROG_TYPE_CGROUP_DEVICE) attached to the container's cgroup, on a cgroup v1 (or
//! hybrid) node a devices cgroup of its own (deny all, then its rules), as runc writes them. The
//! kernel checks every open and mknod of a device node by any process of the cgroup, so a node
//! the container makes with CAP_MKNOD, or finds in a layer or a volume, reaches no host device it
//! was not given.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType};

/// A rule: device type (`None` for all), major and minor (`None` for any), the accesses it
/// allows (`r`, `w`, `m`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub kind: Option<char>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: String,
}

impl Rule {
    pub fn from_oci(d: &LinuxDeviceCgroup) -> Option<Rule> {
        if !d.allow() {
            return None;
        }
        let kind = match d.typ() {
            Some(LinuxDeviceType::C) | Some(LinuxDeviceType::U) => Some('c'),
            Some(LinuxDeviceType::B) => Some('b'),
            Some(LinuxDeviceType::P) => return None,
            Some(LinuxDeviceType::A) | None => None,
        };
        Some(Rule {
            kind,
            major: d.major().and_then(|m| u32::try_from(m).ok()),
            minor: d.minor().and_then(|m| u32::try_from(m).ok()),
            access: d.access().clone().unwrap_or_else(|| "rwm".into()),
        })
    }
}

/// The rule as cgroup v1's `devices.allow` reads it: `c 1:3 rwm`, `b *:* m`, `a`.
pub fn v1_line(r: &Rule) -> String {
    let num = |n: Option<u32>| n.map_or_else(|| "*".to_string(), |n| n.to_string());
    match r.kind {
        None => "a".to_string(),
        Some(k) => format!("{k} {}:{} {}", num(r.major), num(r.minor), r.access),
    }
}

/// cgroup v1's devices hierarchy, where it is mounted (a v1 or hybrid node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1 {
    pub root: PathBuf,
}

impl V1 {
    /// The devices hierarchy from the mount table: a `cgroup` mount with the `devices` option.
    pub fn detect() -> Option<V1> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        V1::from_mounts(&mounts)
    }

    pub fn from_mounts(mounts: &str) -> Option<V1> {
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "devices")).then(
                || V1 {
                    root: PathBuf::from(f[1]),
                },
            )
        })
    }

    /// Makes the cgroup `dir` (below the root, its parents as needed) allowing only `rules`:
    /// `devices.deny a` drops what it inherited, then each rule is allowed. Nothing is left
    /// when a write fails.
    pub fn create(&self, dir: &Path, rules: &[Rule]) -> io::Result<()> {
        if !dir.starts_with(&self.root) || dir == self.root {
            return Err(io::Error::other(format!(
                "{} is not below {}",
                dir.display(),
                self.root.display()
            )));
        }
        // Another container's removal may take the (then empty) parent away meanwhile.
        let mut made = std::fs::create_dir_all(dir);
        for _ in 0..3 {
            match &made {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    made = std::fs::create_dir_all(dir);
                }
                _ => break,
            }
        }
        made?;
        let write = || -> io::Result<()> {
            std::fs::write(dir.join("devices.deny"), "a")?;
            for r in rules.iter().filter(|r| !r.access.is_empty()) {
                std::fs::write(dir.join("devices.allow"), v1_line(r)).map_err(|e| {
                    io::Error::new(e.kind(), format!("devices.allow {:?}: {e}", v1_line(r)))
                })?;
            }
            Ok(())
        };
        write().inspect_err(|_| {
            let _ = std::fs::remove_dir(dir);
        })
    }
}

/// Removes a v1 devices cgroup: whatever is still in it is killed first (a command an exec left
/// behind in a shared PID namespace), then the directory goes, and its parent (crius's own)
/// with it once no container is left there; none there is no error.
pub fn remove_v1(dir: &Path) -> io::Result<()> {
    for attempt in 0..50 {
        let procs = match std::fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => {
                // Fails while another container's cgroup is in it, which is as it should be.
                if let Some(parent) = dir.parent() {
                    let _ = std::fs::remove_dir(parent);
                }
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if attempt == 49 => return Err(e),
            // Killed processes leave the cgroup when the kernel has reaped them.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    Ok(())
}

// eBPF encoding (linux/bpf.h, linux/bpf_common.h).
const LDX_MEM_W: u8 = 0x61;
const ALU32_AND_K: u8 = 0x54;
const ALU32_RSH_K: u8 = 0x74;
const ALU32_MOV_X: u8 = 0xbc;
const ALU64_MOV_K: u8 = 0xb7;
const JMP_JNE_K: u8 = 0x55;
const JMP_JNE_X: u8 = 0x5d;
const JMP_EXIT: u8 = 0x95;

// bpf_cgroup_dev_ctx: access_type (type | access << 16), major, minor.
const DEV_BLOCK: i32 = 1;
const DEV_CHAR: i32 = 2;
const ACC_MKNOD: i32 = 1;
const ACC_READ: i32 = 2;
const ACC_WRITE: i32 = 4;

/// One eBPF instruction as the kernel reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// The instruction as the kernel's `struct bpf_insn` (little-endian register nibbles).
    pub fn raw(&self) -> u64 {
        let o = self.off.to_ne_bytes();
        let i = self.imm.to_ne_bytes();
        u64::from_ne_bytes([self.code, self.regs, o[0], o[1], i[0], i[1], i[2], i[3]])
    }
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

fn access_mask(access: &str) -> i32 {
    access.chars().fold(0, |m, c| {
        m | match c {
            'r' => ACC_READ,
            'w' => ACC_WRITE,
            'm' => ACC_MKNOD,
            _ => 0,
        }
    })
}

/// The program: r2 = type, r3 = requested access, r4 = major, r5 = minor; each rule jumps past
/// itself on any mismatch or returns 1; nothing matched returns 0.
pub fn program(rules: &[Rule]) -> Vec<Insn> {
    let mut p = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),
        insn(ALU32_AND_K, 2, 0, 0, 0xffff),
        insn(LDX_MEM_W, 3, 1, 0, 0),
        insn(ALU32_RSH_K, 3, 0, 0, 16),
        insn(LDX_MEM_W, 4, 1, 4, 0),
        insn(LDX_MEM_W, 5, 1, 8, 0),
    ];
    for r in rules {
        let mask = access_mask(&r.access);
        if mask == 0 {
            continue;
        }
        // Checks as (code, dst, src, imm); each becomes "jump past this rule if not equal".
        let mut checks: Vec<Vec<Insn>> = Vec::new();
        if let Some(k) = r.kind {
            let t = if k == 'b' { DEV_BLOCK } else { DEV_CHAR };
            checks.push(vec![insn(JMP_JNE_K, 2, 0, 0, t)]);
        }
        if mask != ACC_READ | ACC_WRITE | ACC_MKNOD {
            // Every requested access must be allowed: (requested & mask) == requested.
            checks.push(vec![
                insn(ALU32_MOV_X, 1, 3, 0, 0),
                insn(ALU32_AND_K, 1, 0, 0, mask),
                insn(JMP_JNE_X, 1, 3, 0, 0),
            ]);
        }
        if let Some(m) = r.major {
            checks.push(vec![insn(JMP_JNE_K, 4, 0, 0, m as i32)]);
        }
        if let Some(m) = r.minor {
            checks.push(vec![insn(JMP_JNE_K, 5, 0, 0, m as i32)]);
        }
        let mut block: Vec<Insn> = checks.into_iter().flatten().collect();
        block.push(insn(ALU64_MOV_K, 0, 0, 0, 1));
        block.push(insn(JMP_EXIT, 0, 0, 0, 0));
        let len = block.len();
        for (i, ins) in block.iter_mut().enumerate() {
            if ins.code == JMP_JNE_K || ins.code == JMP_JNE_X {
                // Past the end of this rule: the rest of the block after this instruction.
                ins.off = (len - i - 1) as i16;
            }
        }
        p.extend(block);
    }
    p.push(insn(ALU64_MOV_K, 0, 0, 0, 0));
    p.push(insn(JMP_EXIT, 0, 0, 0, 0));
    p
}

/// Loads the program for `rules` and attaches it to the cgroup directory `cgroup`. The cgroup
/// holds it from then on; it goes when the cgroup is removed.
pub fn attach(cgroup: &Path, rules: &[Rule]) -> std::io::Result<()> {
    let prog: Vec<u64> = program(rules).iter().map(Insn::raw).collect();
    let fd = crate::sys::bpf_load_device_program(&prog)?;
    let dir = std::fs::File::open(cgroup)?;
    crate::sys::bpf_attach_device_program(dir.as_fd(), fd.as_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program on one access, interpreting the few instructions it uses.
    fn run(p: &[Insn], kind: i32, access: i32, major: u32, minor: u32) -> u64 {
        let ctx = [(kind | (access << 16)) as u32, major, minor];
        let mut r = [0u64; 11];
        let mut pc = 0;
        loop {
            let i = p[pc];
            let (dst, src) = ((i.regs & 0x0f) as usize, (i.regs >> 4) as usize);
            pc += 1;
            match i.code {
                LDX_MEM_W => {
                    assert_eq!(src, 1);
                    r[dst] = ctx[(i.off / 4) as usize] as u64;
                }
                ALU32_AND_K => r[dst] = (r[dst] as u32 & i.imm as u32) as u64,
                ALU32_RSH_K => r[dst] = ((r[dst] as u32) >> i.imm) as u64,
                ALU32_MOV_X => r[dst] = r[src] as u32 as u64,
                ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
                JMP_JNE_K if r[dst] != i.imm as i64 as u64 => pc += i.off as usize,
                JMP_JNE_X if r[dst] != r[src] => pc += i.off as usize,
                JMP_JNE_K | JMP_JNE_X => {}
                JMP_EXIT => return r[0],
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    fn rule(kind: Option<char>, major: Option<u32>, minor: Option<u32>, access: &str) -> Rule {
        Rule {
            kind,
            major,
            minor,
            access: access.into(),
        }
    }

    #[test]
    fn only_listed_devices_pass() {
        let p = program(&[
            rule(Some('c'), None, None, "m"),
            rule(Some('b'), None, None, "m"),
            rule(Some('c'), Some(1), Some(3), "rwm"),
            rule(Some('c'), Some(136), None, "rw"),
            rule(Some('b'), Some(8), Some(0), "r"),
        ]);
        let (r, w, m) = (ACC_READ, ACC_WRITE, ACC_MKNOD);
        assert_eq!(run(&p, DEV_CHAR, r | w, 1, 3), 1);
        assert_eq!(run(&p, DEV_CHAR, r, 1, 5), 0);
        assert_eq!(run(&p, DEV_CHAR, m, 1, 5), 1);
        assert_eq!(run(&p, DEV_BLOCK, m, 8, 1), 1);
        assert_eq!(run(&p, DEV_BLOCK, r, 8, 1), 0);
        assert_eq!(run(&p, DEV_BLOCK, r, 8, 0), 1);
        assert_eq!(run(&p, DEV_BLOCK, w, 8, 0), 0);
        assert_eq!(run(&p, DEV_CHAR, r | w, 136, 7), 1);
        assert_eq!(run(&p, DEV_BLOCK, r, 136, 7), 0);
        let all = program(&[rule(None, None, None, "rwm")]);
        assert_eq!(run(&all, DEV_BLOCK, r | w, 8, 0), 1);
        assert_eq!(run(&program(&[]), DEV_CHAR, r, 1, 3), 0);
    }

    #[test]
    fn v1_lines_and_mounts() {
        assert_eq!(
            v1_line(&rule(Some('c'), Some(1), Some(3), "rwm")),
            "c 1:3 rwm"
        );
        assert_eq!(v1_line(&rule(Some('b'), None, None, "m")), "b *:* m");
        assert_eq!(
            v1_line(&rule(Some('c'), Some(136), None, "rw")),
            "c 136:* rw"
        );
        assert_eq!(v1_line(&rule(None, None, None, "rwm")), "a");
        let mounts = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid 0 0\n\
                      cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0\n\
                      cgroup /sys/fs/cgroup/devices cgroup rw,nosuid,nodev,noexec,devices 0 0\n";
        assert_eq!(
            V1::from_mounts(mounts),
            Some(V1 {
                root: PathBuf::from("/sys/fs/cgroup/devices")
            })
        );
        assert_eq!(
            V1::from_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"),
            None
        );
        let v1 = V1 {
            root: PathBuf::from("/sys/fs/cgroup/devices"),
        };
        assert!(v1.create(Path::new("/tmp/x"), &[]).is_err());
        assert!(v1.create(&v1.root, &[]).is_err());
    }
}
