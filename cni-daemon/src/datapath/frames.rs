//! The stack frames of each program's chains of BPF calls, added up as Linux 6.1's
//! verifier adds them: each function's frame rounded up to 32 bytes, at most 512 bytes
//! along any chain (`combined stack size of N calls is M. Too large`). Newer kernels
//! may take a chain a little deeper (they count only the stack a verified path
//! touches), so a chain too deep for 6.1 can pass every test on the host: this check
//! finds it from the object alone, in the host's test run.
//!
//! A function's frame is taken from its code: the deepest offset below r10 that it
//! reads, writes or points a helper at. The verifier's count is never more (it counts
//! what the paths it verifies touch), so a chain within 512 bytes here is within them
//! there.

use std::collections::{BTreeSet, HashSet};

use aya_obj::{
    Object,
    generated::{BPF_PSEUDO_CALL, BPF_PSEUDO_FUNC, bpf_insn},
};

/// Bytes of stack the verifier allows a chain of calls, frames rounded up to
/// [`FRAME_GRANULE`].
pub const MAX_CHAIN: u32 = 512;
const FRAME_GRANULE: u32 = 32;

/// A program's deepest chain of calls: the functions from the program's own, each with
/// its frame as its code uses it, and their total as the verifier counts it.
#[derive(Debug)]
pub struct Chain {
    pub program: String,
    pub frames: Vec<(String, u32)>,
    pub total: u32,
}

/// The deepest chain of calls of every program in `object`, as aya links them.
pub fn deepest_chains(object: &[u8]) -> anyhow::Result<Vec<Chain>> {
    let mut object = Object::parse(object)?;
    let text_sections: HashSet<usize> = object
        .functions
        .keys()
        .map(|(section, _)| *section)
        .collect();
    object.relocate_calls(&text_sections)?;
    // The functions a program's code may repeat, to name its parts by.
    let functions: Vec<(String, Vec<u8>)> = object
        .functions
        .values()
        .map(|f| {
            (
                f.name.clone(),
                f.instructions.iter().map(|i| i.code).collect(),
            )
        })
        .collect();
    let mut chains = Vec::new();
    for (program, info) in &object.programs {
        let linked = &object.functions[&info.function_key()];
        let code = &linked.instructions;
        let starts = subprogram_starts(code);
        let frames: Vec<u32> = starts
            .iter()
            .enumerate()
            .map(|(k, &start)| {
                let end = starts.get(k + 1).copied().unwrap_or(code.len());
                frame(&code[start..end])
            })
            .collect();
        let callees: Vec<BTreeSet<usize>> = starts
            .iter()
            .enumerate()
            .map(|(k, &start)| {
                let end = starts.get(k + 1).copied().unwrap_or(code.len());
                calls(code, start, end)
                    .into_iter()
                    .filter_map(|target| starts.iter().position(|&s| s == target))
                    .collect()
            })
            .collect();
        let (total, path) = deepest(0, &frames, &callees);
        let label = |k: usize| {
            if k == 0 {
                return program.clone();
            }
            let end = starts.get(k + 1).copied().unwrap_or(code.len());
            let opcodes: Vec<u8> = code[starts[k]..end].iter().map(|i| i.code).collect();
            functions
                .iter()
                .find(|(_, code)| *code == opcodes)
                .map(|(name, _)| name.clone())
                .unwrap_or_else(|| format!("the function at instruction {}", starts[k]))
        };
        chains.push(Chain {
            program: program.clone(),
            frames: path.into_iter().map(|k| (label(k), frames[k])).collect(),
            total,
        });
    }
    chains.sort_by(|a, b| a.program.cmp(&b.program));
    Ok(chains)
}

/// Where each function of a linked program starts: the program's first instruction and
/// every target of a BPF call or of a callback's address (6.1 counts a callback as a
/// call in the chain too).
fn subprogram_starts(code: &[bpf_insn]) -> Vec<usize> {
    let mut starts = BTreeSet::from([0]);
    starts.extend(calls(code, 0, code.len()));
    starts.into_iter().collect()
}

/// The targets of the calls, and of the callbacks' addresses, in `code[start..end]`.
fn calls(code: &[bpf_insn], start: usize, end: usize) -> Vec<usize> {
    (start..end)
        .filter(|&i| {
            let insn = &code[i];
            (insn.code == CALL && u32::from(insn.src_reg()) == BPF_PSEUDO_CALL)
                || (insn.code == LOAD_IMM64 && u32::from(insn.src_reg()) == BPF_PSEUDO_FUNC)
        })
        .map(|i| (i as i64 + 1 + i64::from(code[i].imm)) as usize)
        .collect()
}

/// The frame `code` uses: the deepest offset below r10 of its loads and stores, and of
/// the pointers it makes from r10 (`rX = r10; rX += -off`, for a helper's arguments).
fn frame(code: &[bpf_insn]) -> u32 {
    let mut deepest = 0i64;
    // Registers that hold r10 plus an offset, as the code moves and adds to them.
    let mut pointers = [None::<i64>; 11];
    for insn in code {
        let (dst, src) = (usize::from(insn.dst_reg()), usize::from(insn.src_reg()));
        let class = insn.code & 0x07;
        match class {
            STX | ST if dst == FP => deepest = deepest.max(-i64::from(insn.off)),
            LDX if src == FP => deepest = deepest.max(-i64::from(insn.off)),
            _ => {}
        }
        if dst > FP {
            continue;
        }
        if insn.code == MOV64_REG && src == FP {
            pointers[dst] = Some(0);
        } else if insn.code == MOV64_REG && pointers.get(src).is_some_and(Option::is_some) {
            pointers[dst] = pointers[src];
        } else if insn.code == ADD64_IMM && pointers[dst].is_some() {
            let offset = pointers[dst].unwrap_or(0) + i64::from(insn.imm);
            pointers[dst] = Some(offset);
            deepest = deepest.max(-offset);
        } else if writes_register(insn) {
            pointers[dst] = None;
        }
        if insn.code == CALL {
            // A call leaves r1 to r5 undefined.
            pointers[1..=5].fill(None);
        }
    }
    deepest.max(0) as u32
}

/// Whether `insn` writes its destination register (an ALU operation or a load).
fn writes_register(insn: &bpf_insn) -> bool {
    matches!(insn.code & 0x07, ALU | ALU64 | LDX | LD)
}

/// The deepest chain from function `k`: its total, rounded as the verifier rounds
/// each frame, and the functions along it.
fn deepest(k: usize, frames: &[u32], callees: &[BTreeSet<usize>]) -> (u32, Vec<usize>) {
    let own = frames[k].max(1).div_ceil(FRAME_GRANULE) * FRAME_GRANULE;
    let (below, mut path) = callees[k]
        .iter()
        .map(|&c| deepest(c, frames, callees))
        .max_by_key(|(total, _)| *total)
        .unwrap_or((0, Vec::new()));
    path.insert(0, k);
    (own + below, path)
}

/// The frame pointer, r10.
const FP: usize = 10;
/// Instruction classes and the opcodes this reads.
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const ALU64: u8 = 0x07;
const CALL: u8 = 0x85;
const LOAD_IMM64: u8 = 0x18;
const MOV64_REG: u8 = 0xbf;
const ADD64_IMM: u8 = 0x07;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_programs_chain_of_calls_fits_the_stack_linux_6_1_allows() {
        let chains = deepest_chains(super::super::OBJECT).expect("the object parses");
        assert!(
            chains
                .iter()
                .any(|c| c.program == "from_pod" && c.frames.len() > 1),
            "from_pod calls functions of its own: {chains:#?}"
        );
        let over: Vec<&Chain> = chains.iter().filter(|c| c.total > MAX_CHAIN).collect();
        assert!(
            over.is_empty(),
            "chains of calls past {MAX_CHAIN} bytes of stack, which Linux 6.1's verifier \
             refuses: {over:#?}"
        );
    }
}
