//! Classic BPF code generation for seccomp filters. The program is built backwards, from its last
//! instruction to its first, so that every jump target (always forward in BPF) is already placed
//! when the jump is written; jumps further than a conditional's 8-bit offset go through an
//! unconditional `ja` trampoline. System calls are dispatched through a binary search over number
//! ranges rather than a linear chain, so a filter of 350 rules costs about nine comparisons.

use libc::sock_filter;

// Instruction classes and fields (linux/bpf_common.h).
const BPF_LD: u16 = 0x00;
const BPF_ALU: u16 = 0x04;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_AND: u16 = 0x50;
const BPF_JA: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;
const BPF_JGT: u16 = 0x20;
const BPF_JGE: u16 = 0x30;
const BPF_K: u16 = 0x00;

/// The kernel's limit on a filter's length (BPF_MAXINSNS).
pub const MAX_INSNS: usize = 4096;

/// Offsets into `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARGS: u32 = 16;

/// A comparison of one 64-bit system call argument, as libseccomp defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Ne,
    Lt,
    Le,
    Eq,
    Ge,
    Gt,
    /// `(arg & value) == value_two`.
    MaskedEq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cond {
    pub index: u8,
    pub op: Op,
    pub value: u64,
    pub value_two: u64,
}

/// What happens to a system call of one number: rules tried in order (all conditions of a rule
/// must hold), then the fallback action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Decision {
    pub rules: Vec<(Vec<Cond>, u32)>,
    pub fallback: u32,
}

/// One architecture's part of a filter: its audit arch value and its decisions by number. Every
/// number not listed gets `otherwise`.
#[derive(Debug, Clone)]
pub struct Section {
    pub audit_arch: u32,
    pub decisions: Vec<(u32, Decision)>,
    pub otherwise: u32,
    /// Numbers from this value on get `above` instead (x32 numbers under the x86_64 arch when x32
    /// is not allowed).
    pub above: Option<(u32, u32)>,
}

/// A label is an instruction's distance from the end of the program.
type Label = usize;

struct Builder {
    rev: Vec<sock_filter>,
    rets: std::collections::HashMap<u32, Label>,
    /// Code already emitted for a decision, shared by every number and ABI with the same one.
    decisions: std::collections::HashMap<Decision, Label>,
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

impl Builder {
    fn push(&mut self, i: sock_filter) -> Label {
        self.rev.push(i);
        self.rev.len() - 1
    }

    fn ret(&mut self, action: u32) -> Label {
        if let Some(l) = self.rets.get(&action) {
            return *l;
        }
        let l = self.push(insn(BPF_RET | BPF_K, 0, 0, action));
        self.rets.insert(action, l);
        l
    }

    fn load(&mut self, offset: u32) -> Label {
        self.push(insn(BPF_LD | BPF_W | BPF_ABS, 0, 0, offset))
    }

    fn and(&mut self, k: u32) -> Label {
        self.push(insn(BPF_ALU | BPF_AND | BPF_K, 0, 0, k))
    }

    fn ja(&mut self, target: Label) -> Label {
        let here = self.rev.len();
        self.push(insn(BPF_JMP | BPF_JA, 0, 0, (here - target - 1) as u32))
    }

    /// A conditional jump; a target out of the 8-bit reach gets a trampoline. The margin of one
    /// leaves room for the other branch's trampoline.
    fn jump(&mut self, op: u16, k: u32, mut jt: Label, mut jf: Label) -> Label {
        if self.rev.len() - jt - 1 > 254 {
            jt = self.ja(jt);
        }
        if self.rev.len() - jf - 1 > 254 {
            jf = self.ja(jf);
        }
        let here = self.rev.len();
        self.push(insn(
            BPF_JMP | op | BPF_K,
            (here - jt - 1) as u8,
            (here - jf - 1) as u8,
            k,
        ))
    }

    /// `(arg & mask) == want` over both 32-bit halves.
    fn eq64(&mut self, index: u8, mask: u64, want: u64, pass: Label, fail: Label) -> Label {
        let (lo, hi) = arg_offsets(index);
        self.jump(BPF_JEQ, want as u32, pass, fail);
        if mask as u32 != u32::MAX {
            self.and(mask as u32);
        }
        let low = self.load(lo);
        self.jump(BPF_JEQ, (want >> 32) as u32, low, fail);
        if (mask >> 32) as u32 != u32::MAX {
            self.and((mask >> 32) as u32);
        }
        self.load(hi)
    }

    /// `arg > v` (strict) or `arg >= v`.
    fn above(&mut self, index: u8, v: u64, strict: bool, pass: Label, fail: Label) -> Label {
        let (lo, hi) = arg_offsets(index);
        self.jump(if strict { BPF_JGT } else { BPF_JGE }, v as u32, pass, fail);
        let low = self.load(lo);
        let equal = self.jump(BPF_JEQ, (v >> 32) as u32, low, fail);
        self.jump(BPF_JGT, (v >> 32) as u32, pass, equal);
        self.load(hi)
    }

    fn cond(&mut self, c: &Cond, pass: Label, fail: Label) -> Label {
        match c.op {
            Op::Eq => self.eq64(c.index, u64::MAX, c.value, pass, fail),
            Op::Ne => self.eq64(c.index, u64::MAX, c.value, fail, pass),
            Op::MaskedEq => self.eq64(c.index, c.value, c.value_two, pass, fail),
            Op::Gt => self.above(c.index, c.value, true, pass, fail),
            Op::Ge => self.above(c.index, c.value, false, pass, fail),
            Op::Lt => self.above(c.index, c.value, false, fail, pass),
            Op::Le => self.above(c.index, c.value, true, fail, pass),
        }
    }

    /// The code for one system call number; it expects nothing in the accumulator.
    fn decision(&mut self, d: &Decision) -> Label {
        if let Some(l) = self.decisions.get(d) {
            return *l;
        }
        let mut next = self.ret(d.fallback);
        for (conds, action) in d.rules.iter().rev() {
            let mut entry = self.ret(*action);
            for c in conds.iter().rev() {
                entry = self.cond(c, entry, next);
            }
            next = entry;
        }
        self.decisions.insert(d.clone(), next);
        next
    }

    /// A binary search over `(start, target)` ranges sorted by start; the number is in the
    /// accumulator.
    fn search(&mut self, ranges: &[(u32, Label)]) -> Label {
        if ranges.len() == 1 {
            return ranges[0].1;
        }
        let mid = ranges.len() / 2;
        let upper = self.search(&ranges[mid..]);
        let lower = self.search(&ranges[..mid]);
        self.jump(BPF_JGE, ranges[mid].0, upper, lower)
    }

    fn section(&mut self, s: &Section) -> Label {
        let mut decisions = s.decisions.clone();
        decisions.sort_by_key(|(nr, _)| *nr);
        decisions.dedup_by_key(|(nr, _)| *nr);
        let otherwise = self.ret(s.otherwise);
        let mut targets: Vec<(u32, Label)> = Vec::new();
        for (nr, d) in &decisions {
            if s.above.is_some_and(|(from, _)| *nr >= from) {
                continue;
            }
            let t = if d.rules.is_empty() {
                self.ret(d.fallback)
            } else {
                self.decision(d)
            };
            targets.push((*nr, t));
        }
        // Ranges covering every number: each decision, and the gaps between them.
        let mut ranges: Vec<(u32, Label)> = vec![(0, otherwise)];
        for (nr, t) in targets {
            set_range(&mut ranges, nr, t);
            if nr < u32::MAX {
                set_range(&mut ranges, nr + 1, otherwise);
            }
        }
        if let Some((from, action)) = s.above {
            let t = self.ret(action);
            ranges.retain(|(start, _)| *start < from);
            ranges.push((from, t));
            // -1 is no call at all (a tracer skipping one): the default action, as libseccomp
            // (so runc) gives it, rather than the bad-ABI kill.
            ranges.push((u32::MAX, otherwise));
        }
        ranges.dedup_by(|b, a| a.1 == b.1);
        let tree = self.search(&ranges);
        if tree + 1 != self.rev.len() {
            // A single range: nothing to compare, the load falls through to a jump.
            self.ja(tree);
        }
        self.load(NR)
    }
}

/// Starts a range at `start` with `target`, replacing one that starts there.
fn set_range(ranges: &mut Vec<(u32, Label)>, start: u32, target: Label) {
    match ranges.last_mut() {
        Some(last) if last.0 == start => last.1 = target,
        _ => ranges.push((start, target)),
    }
}

fn arg_offsets(index: u8) -> (u32, u32) {
    let lo = ARGS + 8 * index as u32;
    // seccomp_data holds the arguments as native 64-bit words.
    if cfg!(target_endian = "little") {
        (lo, lo + 4)
    } else {
        (lo + 4, lo)
    }
}

/// Compiles the sections into a program: dispatch on the architecture (anything else gets
/// `bad_arch`), then each section's search.
pub fn compile(sections: &[Section], bad_arch: u32) -> Vec<sock_filter> {
    let mut b = Builder {
        rev: Vec::new(),
        rets: Default::default(),
        decisions: Default::default(),
    };
    let mut next = b.ret(bad_arch);
    for s in sections.iter().rev() {
        let body = b.section(s);
        next = b.jump(BPF_JEQ, s.audit_arch, body, next);
    }
    let _ = next;
    b.load(ARCH);
    b.rev.reverse();
    b.rev
}

/// A program as bytes (for the bundle), and back.
pub fn to_bytes(prog: &[sock_filter]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prog.len() * 8);
    for i in prog {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.push(i.jt);
        out.push(i.jf);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

pub fn from_bytes(bytes: &[u8]) -> Option<Vec<sock_filter>> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(8) || bytes.len() / 8 > MAX_INSNS {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| {
                insn(
                    u16::from_ne_bytes([c[0], c[1]]),
                    c[2],
                    c[3],
                    u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A seccomp_data for the interpreter.
    pub struct Data {
        pub nr: u32,
        pub arch: u32,
        pub args: [u64; 6],
    }

    /// A classic BPF interpreter for the instructions this module and libseccomp emit, to
    /// check programs without installing them.
    pub fn run(prog: &[sock_filter], d: &Data) -> u32 {
        let word = |off: u32| -> u32 {
            match off {
                NR => d.nr,
                ARCH => d.arch,
                o if (ARGS..ARGS + 48).contains(&o) => {
                    let i = ((o - ARGS) / 8) as usize;
                    let v = d.args[i];
                    if (o - ARGS).is_multiple_of(8) {
                        v as u32
                    } else {
                        (v >> 32) as u32
                    }
                }
                _ => panic!("load at {off}"),
            }
        };
        let mut a = 0u32;
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                c if c == BPF_LD | BPF_W | BPF_ABS => a = word(i.k),
                c if c == BPF_ALU | BPF_AND | BPF_K => a &= i.k,
                c if c == BPF_RET | BPF_K => return i.k,
                c if c == BPF_JMP | BPF_JA => pc += i.k as usize,
                c => {
                    let taken = match c & 0xf0 {
                        BPF_JEQ => a == i.k,
                        BPF_JGT => a > i.k,
                        BPF_JGE => a >= i.k,
                        // Not emitted here; libseccomp's programs (the oracle) may use it.
                        0x40 => a & i.k != 0,
                        _ => panic!("opcode {c:#x}"),
                    };
                    pc += if taken { i.jt } else { i.jf } as usize;
                }
            }
        }
    }

    const X86_64: u32 = 0xc000_003e;
    const ALLOW: u32 = 0x7fff_0000;
    const EPERM: u32 = 0x0005_0001;
    const KILL: u32 = 0x8000_0000;

    fn data(nr: u32, args: [u64; 6]) -> Data {
        Data {
            nr,
            arch: X86_64,
            args,
        }
    }

    fn plain(action: u32) -> Decision {
        Decision {
            rules: vec![],
            fallback: action,
        }
    }

    #[test]
    fn dispatches_numbers_and_arches() {
        let decisions: Vec<(u32, Decision)> = (0..400)
            .filter(|n| n % 3 != 0)
            .map(|n| (n, plain(ALLOW)))
            .collect();
        let prog = compile(
            &[Section {
                audit_arch: X86_64,
                decisions,
                otherwise: EPERM,
                above: Some((0x4000_0000, KILL)),
            }],
            KILL,
        );
        assert!(prog.len() < 300, "{}", prog.len());
        for n in 0..500 {
            let want = if n < 400 && n % 3 != 0 { ALLOW } else { EPERM };
            assert_eq!(run(&prog, &data(n, [0; 6])), want, "nr {n}");
        }
        assert_eq!(run(&prog, &data(0x4000_0001, [0; 6])), KILL);
        assert_eq!(run(&prog, &data(u32::MAX - 1, [0; 6])), KILL);
        assert_eq!(run(&prog, &data(u32::MAX, [0; 6])), EPERM);
        let mut other = data(1, [0; 6]);
        other.arch = 0x4000_0003;
        assert_eq!(run(&prog, &other), KILL);
    }

    #[test]
    fn argument_comparisons_over_64_bits() {
        let values = [
            0u64,
            1,
            7,
            8,
            9,
            0xffff_ffff,
            0x1_0000_0000,
            0x1_0000_0008,
            u64::MAX,
        ];
        let ops = [Op::Eq, Op::Ne, Op::Lt, Op::Le, Op::Ge, Op::Gt];
        for op in ops {
            for v in values {
                let d = Decision {
                    rules: vec![(
                        vec![Cond {
                            index: 2,
                            op,
                            value: v,
                            value_two: 0,
                        }],
                        ALLOW,
                    )],
                    fallback: EPERM,
                };
                let prog = compile(
                    &[Section {
                        audit_arch: X86_64,
                        decisions: vec![(5, d)],
                        otherwise: KILL,
                        above: None,
                    }],
                    KILL,
                );
                for a in values {
                    let holds = match op {
                        Op::Eq => a == v,
                        Op::Ne => a != v,
                        Op::Lt => a < v,
                        Op::Le => a <= v,
                        Op::Ge => a >= v,
                        Op::Gt => a > v,
                        Op::MaskedEq => unreachable!(),
                    };
                    let got = run(&prog, &data(5, [0, 0, a, 0, 0, 0]));
                    assert_eq!(
                        got,
                        if holds { ALLOW } else { EPERM },
                        "{a:#x} {op:?} {v:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn masked_rules_in_order_and_long_jumps() {
        // clone without namespace flags; many rules to force trampolines.
        let mut rules = vec![(
            vec![Cond {
                index: 0,
                op: Op::MaskedEq,
                value: 0x7e02_0000,
                value_two: 0,
            }],
            ALLOW,
        )];
        for v in 100..300u64 {
            rules.push((
                vec![Cond {
                    index: 1,
                    op: Op::Eq,
                    value: v,
                    value_two: 0,
                }],
                0x0005_0000 | v as u32,
            ));
        }
        let decisions = vec![
            (
                56,
                Decision {
                    rules,
                    fallback: EPERM,
                },
            ),
            (57, plain(ALLOW)),
            (1000, plain(ALLOW)),
        ];
        let prog = compile(
            &[Section {
                audit_arch: X86_64,
                decisions,
                otherwise: KILL,
                above: None,
            }],
            KILL,
        );
        assert!(prog.len() > 300);
        assert_eq!(run(&prog, &data(56, [0x11, 0, 0, 0, 0, 0])), ALLOW);
        assert_eq!(
            run(&prog, &data(56, [0x2000_0000, 150, 0, 0, 0, 0])),
            0x0005_0096
        );
        assert_eq!(run(&prog, &data(56, [0x2000_0000, 5, 0, 0, 0, 0])), EPERM);
        assert_eq!(run(&prog, &data(57, [0; 6])), ALLOW);
        assert_eq!(run(&prog, &data(1000, [0; 6])), ALLOW);
        assert_eq!(run(&prog, &data(999, [0; 6])), KILL);
        let bytes = to_bytes(&prog);
        let back = from_bytes(&bytes).expect("round trip");
        assert_eq!(back.len(), prog.len());
        assert!(from_bytes(&bytes[..7]).is_none());
    }
}
