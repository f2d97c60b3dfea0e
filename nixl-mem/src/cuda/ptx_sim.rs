//! Test-only: a small interpreter for the PTX subset the copy kernel uses, so the kernel's
//! actual text is executed on the CPU here (threads run one after another, which is a valid
//! schedule for a kernel whose threads share no data). Every global access is bounds- and
//! alignment-checked as the GPU would fault on it. The GPU run is in tests/gpu_agent.rs.

use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Arg {
    Reg(usize),
    Imm(u64),
    Special(&'static str),
    Mem(usize, u64),
    Vec4([usize; 4]),
    Name(String),
}

#[derive(Debug, Clone)]
struct Instr {
    guard: Option<usize>,
    op: String,
    args: Vec<Arg>,
}

/// A parsed kernel.
pub(crate) struct Program {
    code: Vec<Instr>,
    labels: HashMap<String, usize>,
    nregs: usize,
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

impl Program {
    /// Parses the body of the (only) entry of `ptx`.
    pub fn parse(ptx: &str) -> Program {
        let body = ptx
            .split_once("{\n")
            .map(|(_, b)| b)
            .expect("an entry body");
        let mut regs: HashMap<String, usize> = HashMap::new();
        let mut reg = |name: &str| {
            let n = regs.len();
            *regs.entry(name.to_owned()).or_insert(n)
        };
        let mut code = Vec::new();
        let mut labels = HashMap::new();
        for line in body.lines() {
            let l = strip_comment(line).trim_end_matches(['}', '\0']).trim();
            if l.is_empty() || l.starts_with(".reg") {
                continue;
            }
            if let Some(label) = l.strip_suffix(':') {
                labels.insert(label.to_owned(), code.len());
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
            let args = operands(rest)
                .into_iter()
                .map(|a| {
                    if let Some(inner) = a.strip_prefix('{') {
                        let v: Vec<usize> = inner
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
                    } else if let Some(sp) = ["%ctaid.x", "%nctaid.x", "%tid.x", "%ntid.x"]
                        .into_iter()
                        .find(|s| *s == a)
                    {
                        Arg::Special(sp)
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
                op: op.to_owned(),
                args,
            });
        }
        Program {
            code,
            labels,
            nregs: regs.len(),
        }
    }
}

/// Simulated device memory: one contiguous range at `base`.
pub(crate) struct Memory {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl Memory {
    fn at(&self, addr: u64, n: u64) -> usize {
        assert_eq!(addr % n, 0, "misaligned {n}-byte access at {addr:#x}");
        let off = addr.checked_sub(self.base).expect("address below memory") as usize;
        assert!(
            off + n as usize <= self.bytes.len(),
            "access past memory at {addr:#x}"
        );
        off
    }
    fn load(&self, addr: u64, n: u64) -> u64 {
        let o = self.at(addr, n);
        let mut b = [0u8; 8];
        b[..n as usize].copy_from_slice(&self.bytes[o..o + n as usize]);
        u64::from_le_bytes(b)
    }
    fn store(&mut self, addr: u64, n: u64, v: u64) {
        let o = self.at(addr, n);
        self.bytes[o..o + n as usize].copy_from_slice(&v.to_le_bytes()[..n as usize]);
    }
}

/// Runs the kernel on a `grid` x `ntid` launch with `params`.
pub(crate) fn run(p: &Program, mem: &mut Memory, params: &[(&str, u64)], grid: u32, ntid: u32) {
    for cta in 0..grid {
        for tid in 0..ntid {
            thread(p, mem, params, [cta, grid, tid, ntid]);
        }
    }
}

fn thread(p: &Program, mem: &mut Memory, params: &[(&str, u64)], ids: [u32; 4]) {
    let mut r = vec![0u64; p.nregs];
    let val = |r: &[u64], a: &Arg| -> u64 {
        match a {
            Arg::Reg(i) => r[*i],
            Arg::Imm(v) => *v,
            Arg::Special(s) => u64::from(match *s {
                "%ctaid.x" => ids[0],
                "%nctaid.x" => ids[1],
                "%tid.x" => ids[2],
                _ => ids[3],
            }),
            other => panic!("not a value: {other:?}"),
        }
    };
    let addr = |r: &[u64], a: &Arg| match a {
        Arg::Mem(i, off) => r[*i].wrapping_add(*off),
        other => panic!("not an address: {other:?}"),
    };
    let dst = |a: &Arg| match a {
        Arg::Reg(i) => *i,
        other => panic!("not a register: {other:?}"),
    };
    let mut pc = 0;
    let mut budget = 50_000_000u64;
    loop {
        budget = budget
            .checked_sub(1)
            .expect("the kernel does not terminate");
        let ins = &p.code[pc];
        pc += 1;
        if let Some(g) = ins.guard {
            if r[g] == 0 {
                continue;
            }
        }
        let a = &ins.args;
        let bin = |f: fn(u64, u64) -> u64, r: &mut Vec<u64>| {
            let v = f(val(r, &a[1]), val(r, &a[2]));
            r[dst(&a[0])] = v;
        };
        match ins.op.as_str() {
            "ret" => return,
            "bra" => match &a[0] {
                Arg::Name(l) => pc = p.labels[l],
                other => panic!("bad branch target {other:?}"),
            },
            "ld.param.u64" => {
                let Arg::Name(n) = &a[1] else { panic!("param") };
                r[dst(&a[0])] = params.iter().find(|(k, _)| k == n).expect("param").1;
            }
            "cvta.to.global.u64" | "mov.u64" | "mov.u32" => r[dst(&a[0])] = val(&r, &a[1]),
            "cvt.u64.u32" => r[dst(&a[0])] = val(&r, &a[1]) & 0xffff_ffff,
            "shl.b64" => bin(|x, y| x << y, &mut r),
            "mul.lo.u64" => bin(u64::wrapping_mul, &mut r),
            "add.u64" => bin(u64::wrapping_add, &mut r),
            "sub.u64" => bin(u64::wrapping_sub, &mut r),
            "xor.b64" => bin(|x, y| x ^ y, &mut r),
            "and.b64" => bin(|x, y| x & y, &mut r),
            "min.u64" => bin(u64::min, &mut r),
            "neg.s64" => r[dst(&a[0])] = val(&r, &a[1]).wrapping_neg(),
            "mad.lo.u64" => {
                r[dst(&a[0])] = val(&r, &a[1])
                    .wrapping_mul(val(&r, &a[2]))
                    .wrapping_add(val(&r, &a[3]))
            }
            "setp.ge.u64" => bin(|x, y| u64::from(x >= y), &mut r),
            "setp.ne.u64" => bin(|x, y| u64::from(x != y), &mut r),
            "ld.global.nc.u64" => r[dst(&a[0])] = mem.load(addr(&r, &a[1]), 8),
            "ld.global.u8" => r[dst(&a[0])] = mem.load(addr(&r, &a[1]), 1),
            "st.global.u8" => mem.store(addr(&r, &a[0]), 1, val(&r, &a[1]) & 0xff),
            "ld.global.nc.v4.u32" => {
                let Arg::Vec4(v) = a[0] else { panic!("v4") };
                let base = addr(&r, &a[1]);
                mem.at(base, 16);
                for (k, reg) in v.iter().enumerate() {
                    r[*reg] = mem.load(base + 4 * k as u64, 4);
                }
            }
            "st.global.cs.v4.u32" => {
                let Arg::Vec4(v) = a[1] else { panic!("v4") };
                let base = addr(&r, &a[0]);
                mem.at(base, 16);
                for (k, reg) in v.iter().enumerate() {
                    mem.store(base + 4 * k as u64, 4, r[*reg] & 0xffff_ffff);
                }
            }
            other => panic!("the simulator does not know {other}"),
        }
    }
}
