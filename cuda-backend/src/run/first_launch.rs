//! A map kernel's first launch runs through the interpreter (`render::interpreter`) when its
//! own kernel would have to be compiled: a new fused kernel's first call waits for a launch,
//! not for NVRTC. Its second launch leaves the kernel's compile to the compiler's background
//! thread and is interpreted too, as are the launches after it until the kernel is loaded: a
//! loop pays its compile once, off its path, and a one-off expression (a notebook cell run
//! once) never does. The map's program is rendered once, at the first launch (its disk-cache
//! lookup needs it), and kept for the compile. `STRATA_CUDA_INTERPRET=0` compiles every kernel
//! at its first launch.

use super::step::MapLaunch;
use crate::compile::Compiler;
use crate::function::Function;
use crate::launch::{Args, Launch};
use crate::render::interpreter::{instruction_op, interpreted_op, InterpretSig};
use crate::render::interpreter::{PRECISIONS, REGISTERS, WORDS};
use crate::render::map::MapSig;
use crate::render::{Generated, Rendered};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use strata_core::kernel_cache::KernelCache;
use strata_core::lower::map_plan::Path;
use strata_core::lower::program::{Lanes, Op, Program};
use strata_core::sync::LockUnpoisoned;
use strata_core::{DType, Result};

/// A map interpreted at its first launch.
struct Interpreted {
    /// Its program, until its compile takes it.
    rendered: Mutex<Option<Rendered>>,
    /// Its compile has been left to the background thread (at the second launch).
    queued: AtomicBool,
    /// Its kernel, once the background thread has loaded it.
    compiled: OnceLock<Function>,
}

/// The interpreter, and the maps that had their first launch.
pub(crate) struct FirstLaunches {
    enabled: bool,
    /// Each map interpreted at its first launch.
    interpreted: KernelCache<MapSig<'static>, Arc<Interpreted>>,
    /// The interpreter once compiled or loaded; `None` when that failed (then every map
    /// compiles at its first launch, and the compile is not tried again for each new map).
    interpreter: OnceLock<Option<Function>>,
}

impl FirstLaunches {
    pub(crate) fn new() -> FirstLaunches {
        FirstLaunches {
            enabled: std::env::var("STRATA_CUDA_INTERPRET").map_or(true, |v| v != "0"),
            interpreted: KernelCache::default(),
            interpreter: OnceLock::new(),
        }
    }

    /// True unless `STRATA_CUDA_INTERPRET=0` turned first launches through the interpreter
    /// off (and with them a fused reduction's unfused first calls, `run::unfused`).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// True when the map `sig` planned as `map` runs through the interpreter at its first
    /// launch (the interpreter itself may still have to be compiled, once per machine).
    pub(crate) fn interprets(&self, sig: &MapSig, map: &MapLaunch) -> bool {
        self.enabled && encode(sig, map).is_some()
    }

    /// The interpreter and its launch for the map `sig` (planned as `map`), whose kernel is
    /// not in the function cache: at its first launch, and at later ones while its compile
    /// runs in the background (queued at the second). `None` when the kernel is to be compiled
    /// or taken from the background thread now ([`FirstLaunches::function`]): the disk cache
    /// holds it, the interpreter does not run such maps, or its compile is done.
    pub(crate) fn interpret(
        &self,
        sig: &MapSig,
        map: &MapLaunch,
        compiler: &Compiler,
    ) -> Result<Option<(Function, Launch)>> {
        if !self.enabled {
            return Ok(None);
        }
        if let Some(slot) = self.interpreted.peek(sig) {
            return Ok(self.again(&slot, sig, map, compiler));
        }
        let Some(launch) = encode(sig, map) else {
            return Ok(None);
        };
        let rendered = sig.render()?;
        if compiler.has_cached(&rendered.source, sig.optimization()) {
            return Ok(None);
        }
        let Some(f) = self.interpreter(compiler) else {
            return Ok(None);
        };
        self.interpreted.get(sig, |_| {
            Ok(Arc::new(Interpreted {
                rendered: Mutex::new(Some(rendered)),
                queued: AtomicBool::new(false),
                compiled: OnceLock::new(),
            }))
        })?;
        Ok(Some((f, launch)))
    }

    /// The interpreter and its launch for the map `sig` planned as `map` where it stands in
    /// for part of a fused kernel (`run::unfused`, whose own compile is queued): nothing is
    /// recorded, so no compile of the map's own kernel is ever queued for it. `None` where
    /// the interpreter does not run the map.
    pub(crate) fn interpret_alone(
        &self,
        sig: &MapSig,
        map: &MapLaunch,
        compiler: &Compiler,
    ) -> Option<(Function, Launch)> {
        if !self.enabled {
            return None;
        }
        let launch = encode(sig, map)?;
        Some((self.interpreter(compiler)?, launch))
    }

    /// The interpreter, compiled or loaded at its first use; `None` when that failed (the map
    /// then compiles as it would without it, and says why if that fails too).
    fn interpreter(&self, compiler: &Compiler) -> Option<Function> {
        self.interpreter
            .get_or_init(|| {
                let rendered = InterpretSig.render().ok()?;
                let optimization = InterpretSig.optimization();
                Function::load(compiler, rendered, InterpretSig::NAME, optimization).ok()
            })
            .clone()
    }

    /// A later launch of the interpreted map `slot`: interpreted while its compile is under
    /// way (queued now, at the second launch); `None` once it is done, or where the
    /// background thread cannot take it (the caller then compiles it).
    fn again(
        &self,
        slot: &Arc<Interpreted>,
        sig: &MapSig,
        map: &MapLaunch,
        compiler: &Compiler,
    ) -> Option<(Function, Launch)> {
        if slot.compiled.get().is_some() {
            return None;
        }
        if !slot.queued.swap(true, Ordering::Relaxed) {
            let rendered = slot.rendered.lock_unpoisoned().clone()?;
            let optimization = sig.optimization();
            let done = slot.clone();
            let source = rendered.source.clone();
            let then = Box::new(move |f: Result<_>| {
                if let Ok(f) =
                    f.and_then(|f| Function::loaded(f, rendered, MapSig::NAME, optimization))
                {
                    let _ = done.compiled.set(f);
                    done.rendered.lock_unpoisoned().take();
                }
            });
            if !compiler.compile_later(source, MapSig::NAME.into(), optimization, then) {
                return None;
            }
        }
        let f = self.interpreter.get().cloned().flatten()?;
        Some((f, encode(sig, map)?))
    }

    /// The kernel of `sig`: the one the background thread compiled, else compiled now from
    /// the program its first launch rendered (taken: it is compiled once) or from a new one.
    pub(crate) fn function(&self, sig: &MapSig, compiler: &Compiler) -> Result<Function> {
        let slot = self.interpreted.peek(sig);
        if let Some(f) = slot.as_ref().and_then(|s| s.compiled.get()) {
            return Ok(f.clone());
        }
        let kept = slot.and_then(|s| s.rendered.lock_unpoisoned().take());
        let rendered = match kept {
            Some(r) => r,
            None => sig.render()?,
        };
        Function::load(compiler, rendered, MapSig::NAME, sig.optimization())
    }
}

/// The interpreter's launch for the map `sig` planned as `map`, or `None` when the map is not
/// one the interpreter runs (see `render::interpreter`) or its program does not fit.
pub(crate) fn encode(sig: &MapSig, map: &MapLaunch) -> Option<Launch> {
    let kind = |d: DType| PRECISIONS.iter().position(|&p| p == d);
    if sig.dtypes.iter().any(|&d| kind(d).is_none())
        || sig
            .paths
            .iter()
            .any(|&p| p != Path::Contiguous && p != Path::Strided)
        || sig.scalars.iter().any(|&d| kind(d).is_none())
    {
        return None;
    }
    let rank = sig.rank;
    let outputs = sig.trees.outputs();
    let inputs = sig.dtypes.len().checked_sub(outputs)?;
    // Each operand's words in the interpreter's form: pointer, form (contiguous, and how it
    // is stored in bits 8-9), strides.
    let mut operands = Vec::new();
    for ((&path, (address, strides)), &d) in sig.paths.iter().zip(&map.operands).zip(&sig.dtypes) {
        operands.push(*address);
        let stored = (kind(d)? as u64) << 8;
        if path == Path::Contiguous {
            operands.push(1 | stored);
            operands.extend(std::iter::repeat_n(0, rank));
        } else {
            operands.push(stored);
            operands.extend(strides.iter().map(|&s| s as i64 as u64));
        }
    }
    let program = Program::build(sig.trees.iter(), Lanes::one());
    let scalars: Vec<u32> = sig
        .scalars
        .iter()
        .zip(&map.scalars)
        .map(|(&d, &w)| f32_bits(d, w))
        .collect::<Option<_>>()?;
    let (constants, code, results) = encode_program(&program, inputs, &scalars)?;
    let mut args = Args::new();
    args.push(map.numel as u64);
    args.push(rank as u64);
    args.0.extend(map.shape.iter().map(|&n| n as u64));
    args.push(outputs as u64);
    args.push(inputs as u64);
    args.0.extend_from_slice(&operands);
    args.0.extend(results.iter().map(|&r| r as u64));
    args.push(constants.len() as u64);
    args.0.extend(constants.iter().map(|&c| c as u64));
    args.push(code.len() as u64);
    args.0.extend_from_slice(&code);
    if args.0.len() > WORDS {
        return None;
    }
    args.0.resize(WORDS, 0);
    Some(Launch::linear(args, map.numel))
}

/// The f32 bits of a value of float dtype `d` (f32, f16 or bf16) stored in the low bits of
/// `word`: the register an interpreted value of `d` is held in, as the device's conversion
/// gives it (bf16: the bits shifted; f16: exact for every number). `None` for an f16 NaN,
/// whose payload the device's conversion may not keep as the host's does: such a map compiles.
fn f32_bits(d: DType, word: u64) -> Option<u32> {
    match d {
        DType::F32 => Some(word as u32),
        DType::F16 => {
            let h = half::f16::from_bits(word as u16);
            (!h.is_nan()).then(|| h.to_f32().to_bits())
        }
        DType::BF16 => Some(((word as u16) as u32) << 16),
        _ => None,
    }
}

/// The interpreter's program for `program`'s one lane: the constant registers' f32 bits (the
/// launch scalars `scalars`, already as f32 bits, then the literals), the instruction words,
/// and the registers of the outputs. Registers `0..inputs` hold the inputs, then the
/// constants, then one per instruction in the order they run. `None` for a value the
/// interpreter does not compute or too many registers.
fn encode_program(
    program: &Program,
    inputs: usize,
    scalars: &[u32],
) -> Option<(Vec<u32>, Vec<u64>, Vec<usize>)> {
    let mut constants = scalars.to_vec();
    // Constants first (literals after the scalars), so the temporaries follow all of them.
    let mut literal = vec![None; program.instrs.len()];
    for (i, instr) in program.instrs.iter().enumerate() {
        if let Op::Literal(bits) = instr.op {
            if let Some(f) = f32_bits(instr.dtype, bits) {
                constants.push(f);
                literal[i] = Some(inputs + constants.len() - 1);
            }
        }
    }
    let mut register = vec![0usize; program.instrs.len()];
    let mut code = Vec::new();
    for (i, instr) in program.instrs.iter().enumerate() {
        let float = PRECISIONS.contains(&instr.dtype);
        register[i] = match instr.op {
            Op::Input { input, .. } if float && input < inputs => input,
            Op::Scalar(k) if float && k < scalars.len() => inputs + k,
            Op::Literal(_) => literal[i]?,
            ref op => {
                let (opcode, precision) =
                    interpreted_op(op, instr.dtype, |a| program.instrs[a].dtype)?;
                let code_of = instruction_op(opcode, precision)?;
                let args = op.args();
                let operand = |k: usize| args.get(k).map_or(0, |&a| register[a]) as u64;
                let dst = inputs + constants.len() + code.len();
                code.push(
                    code_of
                        | (dst as u64) << 8
                        | operand(0) << 16
                        | operand(1) << 24
                        | operand(2) << 32,
                );
                dst
            }
        };
    }
    if inputs + constants.len() + code.len() > REGISTERS {
        return None;
    }
    let results = program.outputs[0].iter().map(|&v| register[v]).collect();
    Some((constants, code, results))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::interpreter::Opcode;
    use strata_core::ir::{BinaryOp, UnaryOp};
    use strata_core::ir::{Expr, MapTrees};

    fn sig(expr: Expr, inputs: usize, scalars: usize) -> MapSig<'static> {
        MapSig {
            trees: MapTrees::one(expr),
            dtypes: vec![DType::F32; inputs + 1],
            paths: vec![Path::Contiguous; inputs + 1],
            scalars: vec![DType::F32; scalars],
            rank: 2,
            vector: 4,
            wide: false,
        }
    }

    /// A map launch for `sig`: n = 10 × 100, shape [10, 100], operand k at 0x1000·(k+1)
    /// (strided ones with strides [0, 1], contiguous ones [100, 1]), then the scalars.
    fn planned(sig: &MapSig, scalars: &[f32]) -> MapLaunch {
        let operands = sig
            .paths
            .iter()
            .enumerate()
            .map(|(k, path)| {
                let strides = if *path == Path::Contiguous {
                    [100, 1]
                } else {
                    [0, 1]
                };
                (0x1000 * (k as u64 + 1), strides.into_iter().collect())
            })
            .collect();
        MapLaunch {
            launch: Launch::linear(Args::new(), 1000),
            numel: 1000,
            shape: [10, 100].into_iter().collect(),
            operands,
            scalars: scalars.iter().map(|s| s.to_bits() as u64).collect(),
        }
    }

    /// A decoded instruction: (opcode, dst, a, b, c, rounding).
    type Instruction = (usize, u64, u64, u64, u64, u64);

    /// The interpreter's words after the operands: (results, constants, instructions).
    fn program(w: &[u64]) -> (Vec<u64>, Vec<u64>, Vec<Instruction>) {
        let rank = w[1] as usize;
        let (outputs, inputs) = (w[2 + rank] as usize, w[3 + rank] as usize);
        let results = 4 + rank + (outputs + inputs) * (2 + rank);
        let constants = w[results + outputs] as usize;
        let first_constant = results + outputs + 1;
        let count = w[first_constant + constants] as usize;
        let first = first_constant + constants + 1;
        let decode = |w: u64| {
            let r = |shift: u32| (w >> shift) & 255;
            ((w & 255) as usize, r(8), r(16), r(24), r(32), w >> 40)
        };
        (
            w[results..results + outputs].to_vec(),
            w[first_constant..first_constant + constants].to_vec(),
            w[first..first + count].iter().map(|&x| decode(x)).collect(),
        )
    }

    fn code(op: Opcode) -> usize {
        instruction_op(op, DType::F32).unwrap() as usize
    }

    #[test]
    fn a_chain_becomes_instructions_after_inputs_and_constants() {
        // sqrt(exp(a*a + a) - a) * s0, then * 2 (a literal).
        let a = Expr::input(0, DType::F32);
        let bin = |op, x, y| Expr::binary(op, x, y);
        let inner = bin(
            BinaryOp::Add,
            bin(BinaryOp::Mul, a.clone(), a.clone()),
            a.clone(),
        );
        let root = Expr::unary(
            UnaryOp::Sqrt,
            bin(BinaryOp::Sub, Expr::unary(UnaryOp::Exp, inner), a),
        );
        let e = bin(
            BinaryOp::Mul,
            bin(BinaryOp::Mul, root, Expr::scalar(0, DType::F32)),
            Expr::literal(strata_core::Scalar::F32(2.0)),
        );
        let s = sig(e, 1, 1);
        let l = encode(&s, &planned(&s, &[0.5])).unwrap();
        let w = &l.args.0;
        assert_eq!(w.len(), WORDS);
        // n, rank, shape, one output, one input; each operand contiguous.
        assert_eq!(w[..6], [1000, 2, 10, 100, 1, 1]);
        assert_eq!(w[6..10], [0x1000, 1, 0, 0]);
        assert_eq!(w[10..14], [0x2000, 1, 0, 0]);
        let (results, constants, code_) = program(w);
        // Registers: a = 0, 0.5 = 1, 2 = 2, temporaries from 3.
        assert_eq!(constants, [0.5f32.to_bits() as u64, 2f32.to_bits() as u64]);
        assert_eq!(code_.len(), 7);
        assert_eq!(
            code_[0],
            (code(Opcode::Binary(BinaryOp::Mul)), 3, 0, 0, 0, 0)
        );
        assert_eq!(
            code_[1],
            (code(Opcode::Binary(BinaryOp::Add)), 4, 3, 0, 0, 0)
        );
        assert_eq!(code_[2].0, code(Opcode::Unary(UnaryOp::Exp)));
        assert_eq!(
            code_[5],
            (code(Opcode::Binary(BinaryOp::Mul)), 8, 7, 1, 0, 0)
        );
        assert_eq!(
            code_[6],
            (code(Opcode::Binary(BinaryOp::Mul)), 9, 8, 2, 0, 0)
        );
        assert_eq!(results, [9]);
    }

    #[test]
    fn kept_intermediates_and_broadcast_inputs_are_interpreted() {
        // out0 = exp(a * b), out1 = a * b (kept); b broadcast along axis 0.
        let ab = Expr::binary(
            BinaryOp::Mul,
            Expr::input(0, DType::F32),
            Expr::input(1, DType::F32),
        );
        let mut s = sig(Expr::unary(UnaryOp::Exp, ab.clone()), 2, 0);
        s.trees.also = std::borrow::Cow::Owned(vec![ab]);
        s.dtypes.push(DType::F32);
        s.paths = vec![
            Path::Contiguous,
            Path::Contiguous,
            Path::Contiguous,
            Path::Strided,
        ];
        let l = encode(&s, &planned(&s, &[])).unwrap();
        let w = &l.args.0;
        assert_eq!(w[4..6], [2, 2], "two outputs, two inputs");
        // Operand 3 (input b): strided, strides [0, 1].
        assert_eq!(w[6 + 3 * 4..6 + 4 * 4], [0x4000, 0, 0, 1]);
        let (results, _, code_) = program(w);
        // a * b in register 2, exp in 3: output 0 is 3, output 1 is 2.
        assert_eq!(
            code_[0],
            (code(Opcode::Binary(BinaryOp::Mul)), 2, 0, 1, 0, 0)
        );
        assert_eq!(results, [3, 2]);
    }

    #[test]
    fn maps_it_cannot_run_compile_instead() {
        let a = Expr::input(0, DType::F32);
        let check = |s: &MapSig| encode(s, &planned(s, &[])).is_none();
        // A cast from an integer, an f64 operand, a tiled operand, a position read.
        let cast = Expr::input(0, DType::I32).cast(DType::F32, false);
        assert!(check(&sig(cast, 1, 0)));
        let mut double = sig(a.clone(), 1, 0);
        double.dtypes[1] = DType::F64;
        assert!(check(&double));
        let mut tiled = sig(a, 1, 0);
        tiled.paths[1] = Path::Tiled;
        assert!(check(&tiled));
        let position = Expr::linear_index().cast(DType::F32, false);
        assert!(check(&sig(position, 0, 0)));
    }

    #[test]
    fn half_precision_maps_and_casts_between_floats_are_interpreted() {
        // f16 out = cast(cast(a, f32) * s0, f16) + 1.5 (an f16 literal), a stored as f16.
        let a = Expr::input(0, DType::F16);
        let wide = Expr::binary(
            BinaryOp::Mul,
            a.cast(DType::F32, false),
            Expr::scalar(0, DType::F32),
        );
        let e = Expr::binary(
            BinaryOp::Add,
            wide.cast(DType::F16, false),
            Expr::literal(strata_core::Scalar::F16(half::f16::from_f32(1.5))),
        );
        let mut s = sig(e, 1, 1);
        s.dtypes = vec![DType::F16, DType::F16];
        let l = encode(&s, &planned(&s, &[0.25])).unwrap();
        let w = &l.args.0;
        // Both operands contiguous and stored as f16 (form 1 | 1 << 8).
        assert_eq!((w[7], w[11]), (0x101, 0x101));
        let (results, constants, code_) = program(w);
        // The f16 literal as f32 bits, after the scalar.
        assert_eq!(
            constants,
            [0.25f32.to_bits() as u64, 1.5f32.to_bits() as u64]
        );
        // Each op's code, and its rounding (bits 40-41 of its word).
        let ops: Vec<(usize, u64)> = code_.iter().map(|c| (c.0, c.5)).collect();
        assert_eq!(
            ops,
            [
                (code(Opcode::Cast), 0),
                (code(Opcode::Binary(BinaryOp::Mul)), 0),
                (code(Opcode::Cast), 1),
                (code(Opcode::Binary(BinaryOp::Add)), 1),
            ]
        );
        assert_eq!(results, [6]);
    }

    #[test]
    fn more_values_than_registers_compile_instead() {
        let mut e = Expr::input(0, DType::F32);
        for _ in 0..REGISTERS {
            e = Expr::unary(UnaryOp::Exp, e);
        }
        let s = sig(e, 1, 0);
        assert!(encode(&s, &planned(&s, &[])).is_none());
    }

    #[test]
    fn comparisons_feed_where_as_zero_or_one() {
        let a = Expr::input(0, DType::F32);
        let b = Expr::input(1, DType::F32);
        let e = Expr::select(Expr::binary(BinaryOp::Lt, a.clone(), b.clone()), a, b);
        let s = sig(e, 2, 0);
        assert!(encode(&s, &planned(&s, &[])).is_some());
    }
}
