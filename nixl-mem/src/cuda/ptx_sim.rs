//! Test-only: a small interpreter for the PTX subset the copy kernel uses, so the kernel's
//! actual text is executed on the CPU here. Threads run one after another, which is one valid
//! schedule; the GPU may pick any other, so the simulator also reports every **race**: a byte
//! written by one thread and read or written by another (on the GPU the result would depend on
//! which CTA ran first). Every global access is bounds- and alignment-checked as the GPU would
//! fault on it, and a launch of more threads than the kernel's `.maxntid` is refused (an
//! error) as the driver refuses it. The GPU run is in tests/gpu_agent.rs.

use std::collections::HashMap;

/// An operand as written.
#[derive(Debug, Clone)]
enum Arg {
    Reg(u16),
    Imm(u64),
    Special(u8),
    Mem(u16, u64),
    Vec4([u16; 4]),
    Name(String),
}

/// A value operand.
#[derive(Debug, Clone, Copy)]
enum Val {
    Reg(u16),
    Imm(u64),
    Special(u8),
}

#[derive(Debug, Clone, Copy)]
enum BinOp {
    Shl,
    Mul,
    Add,
    Sub,
    Xor,
    And,
    Min,
    Div,
    Div32,
    Ge,
    Ne,
}

/// A decoded instruction (registers as indices, branch targets resolved).
#[derive(Debug, Clone, Copy)]
enum Ins {
    Ret,
    Bra(u32),
    /// dst, index into the program's parameter names.
    LdParam(u16, u16),
    Mov(u16, Val),
    /// `cvt.u64.u32`: the low 32 bits.
    Cvt(u16, Val),
    Neg(u16, Val),
    Bin(BinOp, u16, Val, Val),
    Mad(u16, Val, Val, Val),
    /// dst, address register, offset, bytes.
    Ld(u16, u16, u64, u8),
    /// address register, offset, value, bytes.
    St(u16, u64, Val, u8),
    LdV4([u16; 4], u16, u64),
    StV4(u16, u64, [u16; 4]),
    /// Barriers and fences: no-ops here (threads run one after another).
    Nop,
    /// `atom.global.add.u64`: dst, address register, offset, value. Atomics never race.
    AtomAdd(u16, u16, u64, Val),
}

#[derive(Debug, Clone, Copy)]
struct Instr {
    guard: Option<u16>,
    ins: Ins,
}

/// A parsed kernel.
pub(crate) struct Program {
    code: Vec<Instr>,
    params: Vec<String>,
    nregs: usize,
    maxntid: u32,
}

fn val(a: &Arg) -> Val {
    match a {
        Arg::Reg(r) => Val::Reg(*r),
        Arg::Imm(i) => Val::Imm(*i),
        Arg::Special(s) => Val::Special(*s),
        other => panic!("not a value: {other:?}"),
    }
}

fn reg_of(a: &Arg) -> u16 {
    match a {
        Arg::Reg(r) => *r,
        other => panic!("not a register: {other:?}"),
    }
}

fn mem_of(a: &Arg) -> (u16, u64) {
    match a {
        Arg::Mem(r, off) => (*r, *off),
        other => panic!("not an address: {other:?}"),
    }
}

fn vec_of(a: &Arg) -> [u16; 4] {
    match a {
        Arg::Vec4(v) => *v,
        other => panic!("not four registers: {other:?}"),
    }
}

/// Decodes one instruction; branch targets are label names until [`Program::parse`] resolves
/// them (`labels`).
fn decode(op: &str, a: &[Arg], labels: &mut Vec<String>, params: &mut Vec<String>) -> Ins {
    let bin = |o| Ins::Bin(o, reg_of(&a[0]), val(&a[1]), val(&a[2]));
    match op {
        "ret" => Ins::Ret,
        "bra" => {
            let Arg::Name(l) = &a[0] else {
                panic!("bad branch {a:?}")
            };
            labels.push(l.clone());
            Ins::Bra(labels.len() as u32 - 1)
        }
        "ld.param.u64" => {
            let Arg::Name(n) = &a[1] else {
                panic!("bad param {a:?}")
            };
            params.push(n.clone());
            Ins::LdParam(reg_of(&a[0]), params.len() as u16 - 1)
        }
        "cvta.to.global.u64" | "mov.u64" | "mov.u32" => Ins::Mov(reg_of(&a[0]), val(&a[1])),
        // Both keep the low 32 bits (32-bit registers hold them zero-extended here).
        "cvt.u64.u32" | "cvt.u32.u64" => Ins::Cvt(reg_of(&a[0]), val(&a[1])),
        "neg.s64" => Ins::Neg(reg_of(&a[0]), val(&a[1])),
        "shl.b64" => bin(BinOp::Shl),
        "mul.lo.u64" => bin(BinOp::Mul),
        "add.u64" => bin(BinOp::Add),
        "sub.u64" => bin(BinOp::Sub),
        "xor.b64" => bin(BinOp::Xor),
        "and.b64" => bin(BinOp::And),
        "min.u64" => bin(BinOp::Min),
        "div.u64" => bin(BinOp::Div),
        "div.u32" => bin(BinOp::Div32),
        "setp.ge.u64" => bin(BinOp::Ge),
        "setp.ne.u64" => bin(BinOp::Ne),
        "mad.lo.u64" => Ins::Mad(reg_of(&a[0]), val(&a[1]), val(&a[2]), val(&a[3])),
        "ld.global.nc.u64" | "ld.global.u8" => {
            let (r, off) = mem_of(&a[1]);
            Ins::Ld(
                reg_of(&a[0]),
                r,
                off,
                if op.ends_with("u64") { 8 } else { 1 },
            )
        }
        "st.global.u8" => {
            let (r, off) = mem_of(&a[0]);
            Ins::St(r, off, val(&a[1]), 1)
        }
        "ld.global.nc.v4.u32" | "ld.global.v4.u32" => {
            let (r, off) = mem_of(&a[1]);
            Ins::LdV4(vec_of(&a[0]), r, off)
        }
        // Cache hints do not change what a single thread sees.
        "st.global.cs.v4.u32" | "st.global.v4.u32" | "st.global.wb.v4.u32" => {
            let (r, off) = mem_of(&a[0]);
            Ins::StV4(r, off, vec_of(&a[1]))
        }
        // One thread runs at a time: a barrier or fence changes nothing it could see.
        "bar.sync" | "membar.gl" | "membar.sys" => Ins::Nop,
        "atom.global.add.u64" => {
            let (r, off) = mem_of(&a[1]);
            Ins::AtomAdd(reg_of(&a[0]), r, off, val(&a[2]))
        }
        other => panic!("the simulator does not know {other}"),
    }
}

fn strip_comment(l: &str) -> &str {
    l.split("//").next().unwrap_or("").trim()
}

/// Splits operands on commas outside braces.
fn operands(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_owned());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_owned());
    }
    out
}

const SPECIALS: [&str; 4] = ["%ctaid.x", "%nctaid.x", "%tid.x", "%ntid.x"];

impl Program {
    /// Parses the body of the (only) entry of `ptx`.
    pub(crate) fn parse(ptx: &str) -> Program {
        let (head, body) = ptx.split_once("{\n").expect("an entry body");
        let maxntid = head
            .lines()
            .find_map(|l| strip_comment(l).strip_prefix(".maxntid"))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .expect(".maxntid");
        let mut regs: HashMap<String, u16> = HashMap::new();
        let mut reg = |name: &str| {
            let n = regs.len() as u16;
            *regs.entry(name.to_owned()).or_insert(n)
        };
        let mut code = Vec::new();
        let mut labels = HashMap::new();
        let (mut targets, mut params) = (Vec::new(), Vec::new());
        for line in body.lines() {
            let l = strip_comment(line).trim_end_matches(['}', '\0']).trim();
            if l.is_empty() || l.starts_with(".reg") {
                continue;
            }
            if let Some(label) = l.strip_suffix(':') {
                labels.insert(label.to_owned(), code.len() as u32);
                continue;
            }
            let l = l
                .strip_suffix(';')
                .unwrap_or_else(|| panic!("no ';' in {l:?}"));
            let (guard, l) = match l.strip_prefix('@') {
                Some(rest) => {
                    let (p, rest) = rest.split_once(char::is_whitespace).expect("guarded op");
                    (Some(reg(p)), rest.trim())
                }
                None => (None, l),
            };
            let (op, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            let args: Vec<Arg> = operands(rest)
                .into_iter()
                .map(|a| {
                    if let Some(inner) = a.strip_prefix('{') {
                        let v: Vec<u16> = inner
                            .trim_end_matches('}')
                            .split(',')
                            .map(|r| reg(r.trim()))
                            .collect();
                        Arg::Vec4(v.try_into().expect("four registers"))
                    } else if let Some(inner) = a.strip_prefix('[') {
                        let inner = inner.trim_end_matches(']');
                        match inner.split_once('+') {
                            Some((r, off)) => Arg::Mem(reg(r), off.parse().expect("offset")),
                            None if inner.starts_with('%') => Arg::Mem(reg(inner), 0),
                            None => Arg::Name(inner.to_owned()),
                        }
                    } else if let Some(sp) = SPECIALS.iter().position(|s| *s == a) {
                        Arg::Special(sp as u8)
                    } else if a.starts_with('%') {
                        Arg::Reg(reg(&a))
                    } else if let Ok(i) = a.parse::<i64>() {
                        Arg::Imm(i as u64)
                    } else {
                        Arg::Name(a)
                    }
                })
                .collect();
            code.push(Instr {
                guard,
                ins: decode(op, &args, &mut targets, &mut params),
            });
        }
        for i in &mut code {
            if let Ins::Bra(t) = &mut i.ins {
                let name = &targets[*t as usize];
                *t = *labels
                    .get(name)
                    .unwrap_or_else(|| panic!("no label {name}"));
            }
        }
        Program {
            code,
            params,
            nregs: regs.len(),
            maxntid,
        }
    }
}

/// Who last touched a byte: 0 none, a thread's number (from 1), or [`MANY`] readers.
const MANY: u32 = u32::MAX;

/// Simulated device memory: one contiguous range at `base`, with, per byte, the thread that
/// wrote it and the thread(s) that read it, to find races.
pub(crate) struct Memory {
    pub base: u64,
    pub bytes: Vec<u8>,
    writer: Vec<u32>,
    reader: Vec<u32>,
    race: Option<String>,
}

impl Memory {
    pub(crate) fn new(base: u64, bytes: Vec<u8>) -> Memory {
        let n = bytes.len();
        Memory {
            base,
            bytes,
            writer: vec![0; n],
            reader: vec![0; n],
            race: None,
        }
    }

    fn at(&self, addr: u64, n: u64) -> usize {
        assert_eq!(addr % n, 0, "misaligned {n}-byte access at {addr:#x}");
        let off = addr.checked_sub(self.base).expect("address below memory") as usize;
        assert!(
            off + n as usize <= self.bytes.len(),
            "access past memory at {addr:#x}"
        );
        off
    }

    fn found(&mut self, what: &str, addr: u64, a: u32, b: u32) {
        if self.race.is_none() {
            let who = |t: u32| match t {
                MANY => "several threads".to_owned(),
                t => format!("thread {}", t - 1),
            };
            self.race = Some(format!(
                "{what} race at {addr:#x}: {} and {}",
                who(a),
                who(b)
            ));
        }
    }

    /// Checks an access of `n` bytes at `addr` by thread `who` and records it; the offset.
    fn access(&mut self, addr: u64, n: u64, who: u32, write: bool) -> usize {
        let o = self.at(addr, n);
        for i in o..o + n as usize {
            let (w, r) = (self.writer[i], self.reader[i]);
            if write {
                if w != 0 && w != who {
                    self.found("write-after-write", self.base + i as u64, w, who);
                } else if r != 0 && r != who {
                    self.found("write-after-read", self.base + i as u64, r, who);
                }
                self.writer[i] = who;
            } else {
                if w != 0 && w != who {
                    self.found("read-after-write", self.base + i as u64, w, who);
                }
                if r != who {
                    self.reader[i] = if r == 0 { who } else { MANY };
                }
            }
        }
        o
    }
}

/// Runs the kernel on a `grid` x `ntid` launch with `params`. `Err` names the first race
/// (the bytes are then those of this one schedule; the GPU may leave others), or says that
/// the driver would refuse the launch (more threads than `.maxntid`).
pub(crate) fn run(
    p: &Program,
    mem: &mut Memory,
    params: &[(&str, u64)],
    grid: u32,
    ntid: u32,
) -> Result<(), String> {
    if !(1..=p.maxntid).contains(&ntid) {
        return Err(format!(
            "a launch of {ntid} threads for a kernel of .maxntid {} fails",
            p.maxntid
        ));
    }
    let values: Vec<u64> = p
        .params
        .iter()
        .map(|n| {
            params
                .iter()
                .find(|(k, _)| k == n)
                .unwrap_or_else(|| panic!("no value for parameter {n}"))
                .1
        })
        .collect();
    for cta in 0..grid {
        for tid in 0..ntid {
            thread(p, mem, &values, [cta, grid, tid, ntid]);
        }
    }
    match mem.race.take() {
        Some(r) => Err(r),
        None => Ok(()),
    }
}

fn thread(p: &Program, mem: &mut Memory, params: &[u64], ids: [u32; 4]) {
    let who = ids[0] * ids[3] + ids[2] + 1;
    let mut r = vec![0u64; p.nregs];
    let v = |r: &[u64], a: Val| -> u64 {
        match a {
            Val::Reg(i) => r[usize::from(i)],
            Val::Imm(x) => x,
            Val::Special(s) => u64::from(ids[usize::from(s)]),
        }
    };
    let mut pc = 0usize;
    let mut budget = 50_000_000u64;
    loop {
        budget = budget
            .checked_sub(1)
            .expect("the kernel does not terminate");
        let Instr { guard, ins } = p.code[pc];
        pc += 1;
        if let Some(g) = guard {
            if r[usize::from(g)] == 0 {
                continue;
            }
        }
        match ins {
            Ins::Ret => return,
            Ins::Bra(t) => pc = t as usize,
            Ins::LdParam(d, i) => r[usize::from(d)] = params[usize::from(i)],
            Ins::Mov(d, a) => r[usize::from(d)] = v(&r, a),
            Ins::Cvt(d, a) => r[usize::from(d)] = v(&r, a) & 0xffff_ffff,
            Ins::Neg(d, a) => r[usize::from(d)] = v(&r, a).wrapping_neg(),
            Ins::Bin(o, d, a, b) => {
                let (x, y) = (v(&r, a), v(&r, b));
                r[usize::from(d)] = match o {
                    BinOp::Shl => x << y,
                    BinOp::Mul => x.wrapping_mul(y),
                    BinOp::Add => x.wrapping_add(y),
                    BinOp::Sub => x.wrapping_sub(y),
                    BinOp::Xor => x ^ y,
                    BinOp::And => x & y,
                    BinOp::Min => x.min(y),
                    // PTX leaves division by zero unspecified (no fault): all ones here.
                    BinOp::Div => x.checked_div(y).unwrap_or(u64::MAX),
                    BinOp::Div32 => u64::from((x as u32).checked_div(y as u32).unwrap_or(u32::MAX)),
                    BinOp::Ge => u64::from(x >= y),
                    BinOp::Ne => u64::from(x != y),
                };
            }
            Ins::Mad(d, a, b, c) => {
                r[usize::from(d)] = v(&r, a).wrapping_mul(v(&r, b)).wrapping_add(v(&r, c))
            }
            other => mem_op(other, &mut r, mem, who, &v),
        }
    }
}

/// The memory instructions of [`thread`]: loads, stores, vectors and atomics (bounds- and
/// alignment-checked; plain accesses race-tracked, atomics not).
fn mem_op(ins: Ins, r: &mut [u64], mem: &mut Memory, who: u32, v: &dyn Fn(&[u64], Val) -> u64) {
    match ins {
        Ins::Ld(d, a, off, n) => {
            let addr = r[usize::from(a)].wrapping_add(off);
            let o = mem.access(addr, u64::from(n), who, false);
            let mut b = [0u8; 8];
            b[..usize::from(n)].copy_from_slice(&mem.bytes[o..o + usize::from(n)]);
            r[usize::from(d)] = u64::from_le_bytes(b);
        }
        Ins::St(a, off, x, n) => {
            let addr = r[usize::from(a)].wrapping_add(off);
            let o = mem.access(addr, u64::from(n), who, true);
            let x = v(r, x).to_le_bytes();
            mem.bytes[o..o + usize::from(n)].copy_from_slice(&x[..usize::from(n)]);
        }
        Ins::LdV4(regs, a, off) => {
            let addr = r[usize::from(a)].wrapping_add(off);
            let o = mem.access(addr, 16, who, false);
            for (k, reg) in regs.iter().enumerate() {
                let w = &mem.bytes[o + 4 * k..o + 4 * k + 4];
                r[usize::from(*reg)] = u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
            }
        }
        Ins::Nop => {}
        Ins::AtomAdd(d, a, off, x) => {
            let addr = r[usize::from(a)].wrapping_add(off);
            let o = mem.at(addr, 8);
            let mut b = [0u8; 8];
            b.copy_from_slice(&mem.bytes[o..o + 8]);
            let old = u64::from_le_bytes(b);
            mem.bytes[o..o + 8].copy_from_slice(&old.wrapping_add(v(r, x)).to_le_bytes());
            r[usize::from(d)] = old;
        }
        Ins::StV4(a, off, regs) => {
            let addr = r[usize::from(a)].wrapping_add(off);
            let o = mem.access(addr, 16, who, true);
            for (k, reg) in regs.iter().enumerate() {
                let x = (r[usize::from(*reg)] as u32).to_le_bytes();
                mem.bytes[o + 4 * k..o + 4 * k + 4].copy_from_slice(&x);
            }
        }
        _ => unreachable!("not a memory instruction"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-thread kernel whose threads both store to one address: the race is reported,
    /// naming both threads; separate addresses are not a race.
    #[test]
    fn races_between_threads_are_reported() {
        let ptx = "\n.maxntid 2, 1, 1\n{\n\tld.param.u64 \t%rd1, [a];\n\tmov.u32 \t%r1, %tid.x;\n\
                   \tcvt.u64.u32 \t%rd2, %r1;\n\tld.param.u64 \t%rd3, [s];\n\
                   \tmul.lo.u64 \t%rd2, %rd2, %rd3;\n\tadd.u64 \t%rd1, %rd1, %rd2;\n\
                   \tst.global.u8 \t[%rd1], %rd2;\n\tret;\n}\n";
        let p = Program::parse(ptx);
        let mut m = Memory::new(0x1000, vec![0; 16]);
        let e = run(&p, &mut m, &[("a", 0x1004), ("s", 0)], 1, 2).unwrap_err();
        assert!(e.contains("write-after-write race at 0x1004"), "{e}");
        assert!(e.contains("thread 0") && e.contains("thread 1"), "{e}");
        let mut m = Memory::new(0x1000, vec![0; 16]);
        run(&p, &mut m, &[("a", 0x1004), ("s", 1)], 1, 2).unwrap();
        assert_eq!(m.bytes[5], 1);
    }

    #[test]
    fn a_launch_past_maxntid_is_refused() {
        let p = Program::parse("\n.maxntid 2, 1, 1\n{\n\tret;\n}\n");
        let e = run(&p, &mut Memory::new(0, vec![]), &[], 1, 3).unwrap_err();
        assert!(e.contains(".maxntid 2"), "{e}");
        run(&p, &mut Memory::new(0, vec![]), &[], 1, 2).unwrap();
    }
}
