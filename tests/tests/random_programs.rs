//! Random programs: a seeded input of any dtype and rank 0–4 (zero-size and size-1 axes, edge
//! values), random views (negative steps, transposes, broadcasts, offsets), then a chain of 1–4
//! ops from the whole op set, in-place and index writes included. Each program runs on the CPU
//! and on every other device in lockstep; after every step the device's result must equal the
//! CPU's (integers and bools bit for bit, floats within the documented tolerance, the same
//! `Err` or `Ok`). Float results that drift apart inside tolerance are copied back into line
//! before the next step, and a step that disagrees is run again from the CPU's exact inputs, so
//! only a step that is wrong on its own fails. A failure prints the smallest failing program as
//! strata code.
//!
//! `STRATA_RANDOM_PROGRAMS` sets the number of programs (default 200), `STRATA_RANDOM_SEED` the
//! first seed.

use strata::prelude::*;
use strata::{Element, SliceArg};
use strata_tests::Rng;

// ---------------------------------------------------------------- seeded choices

const DTYPES: [DType; 13] = [
    DType::Bool,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
];

/// One value of `dtype`: edge values a third of the time.
fn value(rng: &mut Rng, dtype: DType, subnormals: bool) -> Scalar {
    if dtype == DType::Bool {
        return Scalar::Bool(rng.chance(50));
    }
    if dtype.is_float() {
        let tiny = match dtype {
            DType::F16 => 6e-8,
            DType::BF16 | DType::F32 => 1.4e-45,
            _ => 5e-324,
        };
        let (_, max) = dtype.min_max();
        let mut edges = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            -2.5,
            3.0,
            100.25,
            1e30,
            -1e-30,
            max,
            -max,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -9.0,
            1e-10,
            9.22e18,
        ];
        if subnormals {
            edges.push(tiny);
            edges.push(-tiny);
        }
        let v = if rng.chance(35) {
            rng.pick(&edges)
        } else {
            (rng.below(20001) as f64 - 10000.0) / 1000.0
        };
        return Scalar::F64(v).cast(dtype, false);
    }
    let (lo, hi) = dtype.min_max();
    let edges = [0i128, 1, -1, 2, 3, 7, lo as i128, hi as i128, 5];
    let v = if rng.chance(35) {
        rng.pick(&edges)
    } else if rng.chance(50) {
        rng.below(41) as i128 - 20
    } else {
        // Anywhere in the range: the 64 random bits, wrapped to the dtype.
        rng.word() as i64 as i128
    };
    Scalar::I64(v as i64).cast(dtype, false)
}

// ---------------------------------------------------------------- host data

/// A tensor's values on the host, row-major, with shape and dtype: how a program carries its
/// constants, and how results are compared.
#[derive(Clone, Debug)]
struct Host {
    shape: Vec<usize>,
    dtype: DType,
    vals: Vec<Scalar>,
}

macro_rules! typed {
    ($vals:expr, $t:ty) => {
        $vals
            .iter()
            .map(|s| <$t as Element>::from_scalar(*s))
            .collect::<Vec<$t>>()
    };
}

impl Host {
    /// The largest finite magnitude (0 when there is none).
    fn max_finite(&self) -> f64 {
        self.vals
            .iter()
            .map(|v| v.to_f64().abs())
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
    }

    /// True when an element is a subnormal f32.
    fn has_f32_subnormal(&self) -> bool {
        self.dtype == DType::F32
            && self
                .vals
                .iter()
                .any(|v| v.to_f64() != 0.0 && (v.to_f64() as f32).is_subnormal())
    }

    fn random(rng: &mut Rng, shape: &[usize], dtype: DType, subnormals: bool) -> Host {
        let n = shape.iter().product();
        Host {
            shape: shape.to_vec(),
            dtype,
            vals: (0..n).map(|_| value(rng, dtype, subnormals)).collect(),
        }
    }

    fn of(t: &Tensor) -> Result<Host> {
        let c = t.contiguous()?;
        let vals: Vec<Scalar> = match t.dtype() {
            DType::Bool => c.to_vec::<bool>()?.into_iter().map(Scalar::Bool).collect(),
            DType::U8 => c.to_vec::<u8>()?.into_iter().map(Scalar::U8).collect(),
            DType::U16 => c.to_vec::<u16>()?.into_iter().map(Scalar::U16).collect(),
            DType::U32 => c.to_vec::<u32>()?.into_iter().map(Scalar::U32).collect(),
            DType::U64 => c.to_vec::<u64>()?.into_iter().map(Scalar::U64).collect(),
            DType::I8 => c.to_vec::<i8>()?.into_iter().map(Scalar::I8).collect(),
            DType::I16 => c.to_vec::<i16>()?.into_iter().map(Scalar::I16).collect(),
            DType::I32 => c.to_vec::<i32>()?.into_iter().map(Scalar::I32).collect(),
            DType::I64 => c.to_vec::<i64>()?.into_iter().map(Scalar::I64).collect(),
            DType::F16 => c
                .to_vec::<half::f16>()?
                .into_iter()
                .map(Scalar::F16)
                .collect(),
            DType::BF16 => c
                .to_vec::<half::bf16>()?
                .into_iter()
                .map(Scalar::BF16)
                .collect(),
            DType::F32 => c.to_vec::<f32>()?.into_iter().map(Scalar::F32).collect(),
            DType::F64 => c.to_vec::<f64>()?.into_iter().map(Scalar::F64).collect(),
        };
        Ok(Host {
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
            vals,
        })
    }

    fn tensor(&self, dev: &Device) -> Result<Tensor> {
        let (v, s) = (&self.vals, &self.shape[..]);
        match self.dtype {
            DType::Bool => Tensor::from_slice(&typed!(v, bool), s, dev),
            DType::U8 => Tensor::from_slice(&typed!(v, u8), s, dev),
            DType::U16 => Tensor::from_slice(&typed!(v, u16), s, dev),
            DType::U32 => Tensor::from_slice(&typed!(v, u32), s, dev),
            DType::U64 => Tensor::from_slice(&typed!(v, u64), s, dev),
            DType::I8 => Tensor::from_slice(&typed!(v, i8), s, dev),
            DType::I16 => Tensor::from_slice(&typed!(v, i16), s, dev),
            DType::I32 => Tensor::from_slice(&typed!(v, i32), s, dev),
            DType::I64 => Tensor::from_slice(&typed!(v, i64), s, dev),
            DType::F16 => Tensor::from_slice(&typed!(v, half::f16), s, dev),
            DType::BF16 => Tensor::from_slice(&typed!(v, half::bf16), s, dev),
            DType::F32 => Tensor::from_slice(&typed!(v, f32), s, dev),
            DType::F64 => Tensor::from_slice(&typed!(v, f64), s, dev),
        }
    }

    /// Rust code making this tensor on `dev`.
    fn code(&self) -> String {
        let lit = |s: &Scalar| -> String {
            match s {
                Scalar::Bool(b) => b.to_string(),
                s if s.dtype().is_float() => float_code(s.to_f64()),
                Scalar::U64(v) => format!("{v}u64"),
                s => format!("{}i64", s.to_i128()),
            }
        };
        let vals: Vec<String> = self.vals.iter().map(lit).collect();
        // Floats go through f64 and integers through i64 (u64 for u64), then the cast, which is
        // exact for every value listed.
        let (elem, cast) = match self.dtype {
            DType::Bool => ("bool", None),
            DType::U64 => ("u64", None),
            DType::F64 => ("f64", None),
            DType::I64 => ("i64", None),
            d if d.is_float() => ("f64", Some(d)),
            d => ("i64", Some(d)),
        };
        let mut s = format!(
            "Tensor::from_slice::<{elem}>(&[{}], {:?}, &dev)?",
            vals.join(", "),
            self.shape
        );
        if let Some(d) = cast {
            s += &format!(".to_dtype(DType::{d:?})?");
        }
        s
    }
}

/// An f64 as a Rust expression.
fn float_code(f: f64) -> String {
    if f.is_nan() {
        "f64::NAN".into()
    } else if f == f64::INFINITY {
        "f64::INFINITY".into()
    } else if f == f64::NEG_INFINITY {
        "f64::NEG_INFINITY".into()
    } else {
        format!("{f:?}")
    }
}

// ---------------------------------------------------------------- programs

/// A view of the current tensor.
#[derive(Clone, Debug)]
enum View {
    /// `s![.., .., ..;-1]`: axis `.0` reversed by a negative step.
    Reverse(usize),
    Transpose(usize, usize),
    Narrow(usize, usize, usize),
    /// A size-1 axis inserted at `axis`, then broadcast to `shape`.
    Broadcast {
        axis: usize,
        shape: Vec<usize>,
    },
    Flip(usize),
}

/// The second operand of a binary op.
#[derive(Clone, Debug)]
enum Rhs {
    Tensor(Host),
    Int(i64),
    Float(f64),
}

/// One step of a program.
#[derive(Clone, Debug)]
enum Step {
    View(View),
    Unary(&'static str),
    Binary(&'static str, Rhs),
    /// `x.<op>_(rhs)`: an in-place binary op (through the view).
    InPlace(&'static str, Rhs),
    Cast(DType, bool),
    Reduce {
        op: &'static str,
        axis: Option<isize>,
        keepdim: bool,
    },
    Softmax(&'static str, isize),
    Clamp(f64, f64),
    Where(f64),
    Matmul(Host),
    Gather(usize, Host),
    IndexSelect(usize, Host),
    Take(Host),
    MaskedFill(Host, Rhs),
    /// `x.set(s![.., &index], value)` with the index along `axis`.
    SetIndexed(usize, Host, Host),
    ScatterAdd(usize, Host, Host),
    Cat(usize),
    Stack(usize),
    Contiguous,
}

const UNARY: [&str; 34] = [
    "neg",
    "neg_sat",
    "abs",
    "sign",
    "square",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sin",
    "cos",
    "tan",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "erf",
    "floor",
    "ceil",
    "round",
    "trunc",
    "bitwise_not",
    "isnan",
    "isinf",
    "isfinite",
    "logical_not",
    "flatten",
    "t",
];

const BINARY: [&str; 28] = [
    "add",
    "sub",
    "mul",
    "div",
    "floor_divide",
    "remainder",
    "pow",
    "maximum",
    "minimum",
    "atan2",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "add_sat",
    "sub_sat",
    "mul_sat",
    "div_sat",
    "logical_and",
    "logical_or",
    "logical_xor",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
];

const IN_PLACE: [&str; 8] = [
    "add",
    "sub",
    "mul",
    "floor_divide",
    "remainder",
    "maximum",
    "bitwise_xor",
    "div_sat",
];

const REDUCE: [&str; 13] = [
    "sum",
    "sum_upcast",
    "prod",
    "mean",
    "min",
    "max",
    "argmin",
    "argmax",
    "any",
    "all",
    "var",
    "std",
    "logsumexp",
];

fn unary(x: &Tensor, op: &str) -> Result<Tensor> {
    match op {
        "neg" => x.neg(),
        "neg_sat" => x.neg_sat(),
        "abs" => x.abs(),
        "sign" => x.sign(),
        "square" => x.square(),
        "sqrt" => x.sqrt(),
        "rsqrt" => x.rsqrt(),
        "reciprocal" => x.reciprocal(),
        "exp" => x.exp(),
        "exp2" => x.exp2(),
        "expm1" => x.expm1(),
        "log" => x.log(),
        "log2" => x.log2(),
        "log10" => x.log10(),
        "log1p" => x.log1p(),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "tan" => x.tan(),
        "tanh" => x.tanh(),
        "sigmoid" => x.sigmoid(),
        "relu" => x.relu(),
        "gelu" => x.gelu(),
        "erf" => x.erf(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        "round" => x.round(),
        "trunc" => x.trunc(),
        "bitwise_not" => x.bitwise_not(),
        "isnan" => x.isnan(),
        "isinf" => x.isinf(),
        "isfinite" => x.isfinite(),
        "logical_not" => x.logical_not(),
        "flatten" => x.flatten(),
        "t" => x.t(),
        other => unreachable!("unary {other}"),
    }
}

fn binary(x: &Tensor, op: &str, rhs: Value) -> Result<Tensor> {
    match op {
        "add" => x.add(rhs),
        "sub" => x.sub(rhs),
        "mul" => x.mul(rhs),
        "div" => x.div(rhs),
        "floor_divide" => x.floor_divide(rhs),
        "remainder" => x.remainder(rhs),
        "pow" => x.pow(rhs),
        "maximum" => x.maximum(rhs),
        "minimum" => x.minimum(rhs),
        "atan2" => x.atan2(rhs),
        "bitwise_and" => x.bitwise_and(rhs),
        "bitwise_or" => x.bitwise_or(rhs),
        "bitwise_xor" => x.bitwise_xor(rhs),
        "bitwise_left_shift" => x.bitwise_left_shift(rhs),
        "bitwise_right_shift" => x.bitwise_right_shift(rhs),
        "add_sat" => x.add_sat(rhs),
        "sub_sat" => x.sub_sat(rhs),
        "mul_sat" => x.mul_sat(rhs),
        "div_sat" => x.div_sat(rhs),
        "logical_and" => x.logical_and(rhs),
        "logical_or" => x.logical_or(rhs),
        "logical_xor" => x.logical_xor(rhs),
        "eq" => x.eq(rhs),
        "ne" => x.ne(rhs),
        "lt" => x.lt(rhs),
        "le" => x.le(rhs),
        "gt" => x.gt(rhs),
        "ge" => x.ge(rhs),
        other => unreachable!("binary {other}"),
    }
}

fn in_place(x: &Tensor, op: &str, rhs: Value) -> Result<()> {
    match op {
        "add" => x.add_(rhs),
        "sub" => x.sub_(rhs),
        "mul" => x.mul_(rhs),
        "floor_divide" => x.floor_divide_(rhs),
        "remainder" => x.remainder_(rhs),
        "maximum" => x.maximum_(rhs),
        "bitwise_xor" => x.bitwise_xor_(rhs),
        "div_sat" => x.div_sat_(rhs),
        other => unreachable!("in-place {other}"),
    }
}

fn reduce(x: &Tensor, op: &str, axis: Option<isize>, keepdim: bool) -> Result<Tensor> {
    let axes = || axis.map_or(Axes::All, Axes::from);
    match op {
        "sum" => x.sum(axes(), keepdim),
        "sum_upcast" => x.sum_upcast(axes(), keepdim),
        "prod" => x.prod(axes(), keepdim),
        "mean" => x.mean(axes(), keepdim),
        "min" => x.min(axes(), keepdim),
        "max" => x.max(axes(), keepdim),
        "argmin" => x.argmin(axis, keepdim),
        "argmax" => x.argmax(axis, keepdim),
        "any" => x.any(axes(), keepdim),
        "all" => x.all(axes(), keepdim),
        "var" => x.var(axes(), 1, keepdim),
        "std" => x.std(axes(), 0, keepdim),
        "logsumexp" => x.logsumexp(axes(), keepdim),
        other => unreachable!("reduce {other}"),
    }
}

/// What the program works on: the current tensor and the storage it views (in-place steps
/// write through the view into the root, which is compared too).
#[derive(Clone)]
struct State {
    root: Tensor,
    x: Tensor,
}

impl Rhs {
    fn value(&self, dev: &Device) -> Result<Value> {
        Ok(match self {
            Rhs::Tensor(h) => Value::from(h.tensor(dev)?),
            Rhs::Int(i) => Value::from(*i),
            Rhs::Float(f) => Value::from(*f),
        })
    }

    fn code(&self) -> String {
        match self {
            Rhs::Tensor(h) => format!("&{}", h.code()),
            Rhs::Int(i) => format!("{i}i64"),
            Rhs::Float(f) => float_code(*f),
        }
    }
}

impl View {
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        match *self {
            View::Reverse(a) => {
                let mut args = vec![SliceArg::from(..); a];
                args.push(SliceArg::from(..).with_step(-1)?);
                x.slice(args)
            }
            View::Transpose(a, b) => x.transpose(a as isize, b as isize),
            View::Narrow(a, start, len) => x.narrow(a as isize, start, len),
            View::Broadcast { axis, ref shape } => x.unsqueeze(axis as isize)?.expand(shape),
            View::Flip(a) => x.flip(&[a as isize]),
        }
    }

    fn code(&self, x: &str) -> String {
        match self {
            View::Reverse(a) => format!("{x}.slice(s![{}..;-1])", ".., ".repeat(*a)),
            View::Transpose(a, b) => format!("{x}.transpose({a}, {b})"),
            View::Narrow(a, s, l) => format!("{x}.narrow({a}, {s}, {l})"),
            View::Broadcast { axis, shape } => {
                format!("{x}.unsqueeze({axis})?.expand({shape:?})")
            }
            View::Flip(a) => format!("{x}.flip(&[{a}])"),
        }
    }
}

impl Step {
    /// Runs the step on `s` (in place, or replacing the current tensor).
    fn run(&self, s: &mut State, dev: &Device) -> Result<()> {
        let fresh = |t: Tensor| State {
            root: t.clone(),
            x: t,
        };
        let x = &s.x;
        let next = match self {
            Step::View(v) => {
                s.x = v.apply(x)?;
                return Ok(());
            }
            Step::Unary(op) => unary(x, op)?,
            Step::Binary(op, rhs) => binary(x, op, rhs.value(dev)?)?,
            Step::InPlace(op, rhs) => return in_place(x, op, rhs.value(dev)?),
            Step::Cast(d, false) => x.to_dtype(*d)?,
            Step::Cast(d, true) => x.to_dtype_sat(*d)?,
            Step::Reduce { op, axis, keepdim } => reduce(x, op, *axis, *keepdim)?,
            Step::Softmax(op, axis) if *op == "softmax" => x.softmax(*axis)?,
            Step::Softmax(_, axis) => x.log_softmax(*axis)?,
            Step::Clamp(lo, hi) => x.clamp(*lo, *hi)?,
            Step::Where(v) => Tensor::where_cond(&x.gt(0)?, x, *v)?,
            Step::Matmul(h) => x.matmul(&h.tensor(dev)?)?,
            Step::Gather(a, h) => x.gather(*a as isize, &h.tensor(dev)?)?,
            Step::IndexSelect(a, h) => x.index_select(*a as isize, &h.tensor(dev)?)?,
            Step::Take(h) => x.take(&h.tensor(dev)?)?,
            Step::MaskedFill(m, v) => {
                return x.masked_fill_(&m.tensor(dev)?, v.value(dev)?);
            }
            Step::SetIndexed(a, idx, v) => {
                let mut args = vec![SliceArg::from(..); *a];
                args.push(SliceArg::from(&idx.tensor(dev)?));
                return x.set(args, &v.tensor(dev)?);
            }
            Step::ScatterAdd(a, idx, src) => {
                return x.scatter_add_(*a as isize, &idx.tensor(dev)?, &src.tensor(dev)?);
            }
            Step::Cat(a) => Tensor::cat(&[x, x], *a as isize)?,
            Step::Stack(a) => Tensor::stack(&[x, x], *a as isize)?,
            Step::Contiguous => x.contiguous()?,
        };
        *s = fresh(next);
        Ok(())
    }

    /// Runs the step; a gather's range error, which a GPU reports at its next synchronize
    /// rather than at the op, is collected here so that it belongs to this step (a gather
    /// realizes its input anyway, so the synchronize's flush changes no fusion under test).
    fn run_reported(&self, s: &mut State, dev: &Device) -> Result<()> {
        self.run(s, dev)?;
        match self {
            Step::Gather(..) | Step::IndexSelect(..) | Step::Take(..) => dev.synchronize(),
            _ => Ok(()),
        }
    }

    /// True when the step writes into the root.
    fn writes(&self) -> bool {
        matches!(
            self,
            Step::InPlace(..) | Step::MaskedFill(..) | Step::SetIndexed(..) | Step::ScatterAdd(..)
        )
    }

    /// The step as Rust code, from `x` (a statement binding `y`).
    fn code(&self, x: &str, y: &str) -> String {
        let bind = |e: String| format!("let {y} = {e}?;");
        match self {
            Step::View(v) => bind(v.code(x)),
            Step::Unary(op) => bind(format!("{x}.{op}()")),
            Step::Binary(op, rhs) => bind(format!("{x}.{op}({})", rhs.code())),
            Step::InPlace(op, rhs) => format!("{x}.{op}_({})?; let {y} = {x};", rhs.code()),
            Step::Cast(d, sat) => bind(format!(
                "{x}.to_dtype{}(DType::{d:?})",
                if *sat { "_sat" } else { "" }
            )),
            Step::Reduce { op, axis, keepdim } => {
                let axes = match (op.starts_with("arg"), axis) {
                    (true, a) => format!("{a:?}"),
                    (false, None) => "Axes::All".into(),
                    (false, Some(a)) => format!("{a}"),
                };
                let correction = match *op {
                    "var" => "1, ",
                    "std" => "0, ",
                    _ => "",
                };
                bind(format!("{x}.{op}({axes}, {correction}{keepdim})"))
            }
            Step::Softmax(op, a) => bind(format!("{x}.{op}({a})")),
            Step::Clamp(lo, hi) => bind(format!(
                "{x}.clamp({}, {})",
                float_code(*lo),
                float_code(*hi)
            )),
            Step::Where(v) => bind(format!(
                "Tensor::where_cond(&{x}.gt(0)?, &{x}, {})",
                float_code(*v)
            )),
            Step::Matmul(h) => bind(format!("{x}.matmul(&{})", h.code())),
            Step::Gather(a, h) => bind(format!("{x}.gather({a}, &{})", h.code())),
            Step::IndexSelect(a, h) => bind(format!("{x}.index_select({a}, &{})", h.code())),
            Step::Take(h) => bind(format!("{x}.take(&{})", h.code())),
            Step::MaskedFill(m, v) => format!(
                "{x}.masked_fill_(&{}, {})?; let {y} = {x};",
                m.code(),
                v.code()
            ),
            Step::SetIndexed(a, idx, v) => format!(
                "{x}.set(s![{}&{}], &{})?; let {y} = {x};",
                ".., ".repeat(*a),
                idx.code(),
                v.code()
            ),
            Step::ScatterAdd(a, idx, src) => format!(
                "{x}.scatter_add_({a}, &{}, &{})?; let {y} = {x};",
                idx.code(),
                src.code()
            ),
            Step::Cat(a) => bind(format!("Tensor::cat(&[&{x}, &{x}], {a})")),
            Step::Stack(a) => bind(format!("Tensor::stack(&[&{x}, &{x}], {a})")),
            Step::Contiguous => bind(format!("{x}.contiguous()")),
        }
    }
}

/// A shape that broadcasts against `shape`: the same, some axes 1, or a shorter suffix.
fn broadcastable(rng: &mut Rng, shape: &[usize]) -> Vec<usize> {
    let keep = if rng.chance(25) && !shape.is_empty() {
        rng.below(shape.len() + 1)
    } else {
        shape.len()
    };
    shape[shape.len() - keep..]
        .iter()
        .map(|&n| if rng.chance(30) { 1 } else { n })
        .collect()
}

/// Index values for an axis of `n`: mostly in range, negative ones included, rarely out.
/// A 1-D index host without two entries naming the same position of an axis of `n` (out of
/// range entries stay: they are errors on every backend).
fn distinct_positions(mut idx: Host, n: usize) -> Host {
    let mut seen = std::collections::HashSet::new();
    idx.vals.retain(|v| {
        let i = v.to_f64() as i64;
        let pos = if i < 0 { i + n as i64 } else { i };
        !(0..n as i64).contains(&pos) || seen.insert(pos)
    });
    idx.shape = vec![idx.vals.len()];
    idx
}

fn index_host(rng: &mut Rng, shape: &[usize], n: usize) -> Host {
    let count = shape.iter().product();
    let dtype = if rng.chance(50) {
        DType::I64
    } else {
        DType::I32
    };
    let vals = (0..count)
        .map(|_| {
            let v = if rng.chance(4) {
                n as i64 + rng.below(3) as i64
            } else if n == 0 {
                0
            } else {
                rng.below(2 * n) as i64 - n as i64
            };
            Scalar::I64(v).cast(dtype, false)
        })
        .collect();
    Host {
        shape: shape.to_vec(),
        dtype,
        vals,
    }
}

/// A random step for a current tensor of `shape` and `dtype`.
fn random_step(rng: &mut Rng, shape: &[usize], dtype: DType, subnormals: bool) -> Step {
    let rank = shape.len();
    let axis = |rng: &mut Rng| rng.below(rank.max(1));
    let rhs = |rng: &mut Rng| match rng.below(4) {
        0 => Rhs::Int(value(rng, DType::I64, false).to_i128() as i64 % 100),
        1 => Rhs::Float(value(rng, DType::F64, subnormals).to_f64()),
        _ => {
            let d = if rng.chance(60) {
                dtype
            } else {
                rng.pick(&DTYPES)
            };
            let s = broadcastable(rng, shape);
            Rhs::Tensor(Host::random(rng, &s, d, subnormals))
        }
    };
    match rng.below(22) {
        0..=2 => Step::View(match rng.below(5) {
            0 if rank > 0 => View::Reverse(axis(rng)),
            1 => View::Transpose(axis(rng), axis(rng)),
            2 => {
                let a = axis(rng);
                let n = shape.get(a).copied().unwrap_or(1);
                let start = rng.below(n + 1);
                View::Narrow(a, start, rng.below(n - start + 1))
            }
            3 => {
                let a = rng.below(rank + 1);
                let mut s = shape.to_vec();
                s.insert(a, rng.below(3) + 1);
                View::Broadcast { axis: a, shape: s }
            }
            _ => View::Flip(axis(rng)),
        }),
        3..=5 => Step::Unary(rng.pick(&UNARY)),
        6..=9 => Step::Binary(rng.pick(&BINARY), rhs(rng)),
        10 => Step::InPlace(rng.pick(&IN_PLACE), rhs(rng)),
        11 => Step::Cast(rng.pick(&DTYPES), rng.chance(30)),
        12 | 13 => {
            let op = rng.pick(&REDUCE);
            // An axis counted from either end, or all of them.
            let axis = if rank > 0 && rng.chance(70) {
                let a = axis(rng) as isize;
                Some(if rng.chance(50) { a } else { a - rank as isize })
            } else {
                None
            };
            Step::Reduce {
                op,
                axis,
                keepdim: rng.chance(50),
            }
        }
        14 => Step::Softmax(
            if rng.chance(50) {
                "softmax"
            } else {
                "log_softmax"
            },
            axis(rng) as isize,
        ),
        15 => Step::Clamp(
            value(rng, DType::F64, false).to_f64(),
            value(rng, DType::F64, false).to_f64(),
        ),
        16 => Step::Where(value(rng, DType::F64, false).to_f64()),
        17 => {
            let k = shape.last().copied().unwrap_or(1);
            let other = [k, rng.below(4)];
            let d = if rng.chance(70) {
                dtype
            } else {
                rng.pick(&DTYPES)
            };
            let s = &other[..rank.clamp(1, 2)];
            Step::Matmul(Host::random(rng, s, d, subnormals))
        }
        18 => {
            let a = axis(rng);
            match rng.below(4) {
                0 => {
                    let mut s: Vec<usize> = shape.to_vec();
                    if let Some(n) = s.get_mut(a) {
                        *n = rng.below(4);
                    }
                    let n = shape.get(a).copied().unwrap_or(1);
                    Step::Gather(a, index_host(rng, &s, n))
                }
                1 => {
                    let n = shape.get(a).copied().unwrap_or(1);
                    let s = [rng.below(5)];
                    Step::IndexSelect(a, index_host(rng, &s, n))
                }
                2 => {
                    let n = shape.iter().product();
                    let s = [rng.below(4), rng.below(3)];
                    Step::Take(index_host(rng, &s, n))
                }
                _ => {
                    let n = shape.get(a).copied().unwrap_or(1);
                    let s = [rng.below(3) + 1];
                    // Which write wins at a repeated position is unspecified off the CPU
                    // (docs/semantics.md, as in PyTorch): each position once.
                    let idx = distinct_positions(index_host(rng, &s, n), n);
                    let mut vs: Vec<usize> = shape.to_vec();
                    if let Some(k) = vs.get_mut(a) {
                        *k = idx.vals.len();
                    }
                    let d = rng.pick(&DTYPES);
                    Step::SetIndexed(a, idx, Host::random(rng, &vs, d, subnormals))
                }
            }
        }
        19 => {
            let s = broadcastable(rng, shape);
            let mask = Host::random(rng, &s, DType::Bool, false);
            let v = match rng.below(3) {
                0 => Rhs::Int(value(rng, DType::I64, false).to_i128() as i64),
                1 => Rhs::Float(value(rng, DType::F64, subnormals).to_f64()),
                _ => {
                    let d = rng.pick(&DTYPES);
                    Rhs::Tensor(Host::random(rng, &[], d, subnormals))
                }
            };
            Step::MaskedFill(mask, v)
        }
        20 => {
            let a = axis(rng);
            if rng.chance(50) {
                let n = shape.get(a).copied().unwrap_or(1);
                let idx_shape: Vec<usize> = shape.iter().map(|&k| rng.below(k + 1)).collect();
                let idx = index_host(rng, &idx_shape, n);
                Step::ScatterAdd(a, idx, Host::random(rng, &idx_shape, dtype, subnormals))
            } else if rng.chance(50) {
                Step::Cat(a)
            } else {
                Step::Stack(rng.below(rank + 1))
            }
        }
        _ => Step::Contiguous,
    }
}

#[derive(Clone, Debug)]
struct Program {
    input: Host,
    steps: Vec<Step>,
}

impl Program {
    /// A program whose steps are drawn against the shapes the CPU produces as it goes.
    fn random(seed: u64, subnormals: bool) -> Program {
        let mut rng = Rng(seed);
        let rank = rng.below(5);
        let shape: Vec<usize> = (0..rank)
            .map(|_| match rng.below(10) {
                0 => 0,
                1 | 2 => 1,
                _ => rng.below(4) + 1,
            })
            .collect();
        let dtype = rng.pick(&DTYPES);
        let input = Host::random(&mut rng, &shape, dtype, subnormals);
        let cpu = Device::cpu();
        let mut state = match input.tensor(&cpu) {
            Ok(t) => State {
                root: t.clone(),
                x: t,
            },
            Err(_) => unreachable!("host data makes a tensor"),
        };
        let mut steps = Vec::new();
        let views = rng.below(3);
        let ops = 1 + rng.below(4);
        while steps.len() < views + ops {
            let step = if steps.len() < views {
                loop {
                    if let Step::View(v) =
                        random_step(&mut rng, state.x.shape(), state.x.dtype(), subnormals)
                    {
                        break Step::View(v);
                    }
                }
            } else {
                random_step(&mut rng, state.x.shape(), state.x.dtype(), subnormals)
            };
            let ok = step.run(&mut state, &cpu).is_ok() && state.x.numel() <= 4096;
            steps.push(step);
            if !ok {
                break;
            }
        }
        Program { input, steps }
    }

    fn code(&self, dev: &str) -> String {
        let mut s = format!(
            "let dev = Device::parse({dev:?})?;\nlet x0 = {};\n",
            self.input.code()
        );
        for (i, step) in self.steps.iter().enumerate() {
            s += &step.code(&format!("x{i}"), &format!("x{}", i + 1));
            s.push('\n');
        }
        s
    }
}

// ---------------------------------------------------------------- comparison

/// Relative tolerance of a float dtype (the suite's elementwise tolerances, loosened for the
/// composites: softmax, var and logsumexp chain several rounded ops).
fn tolerance(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-9,
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        _ => 3.2e-2,
    }
}

/// Why `got` differs from `want`, if it does. `scale` is the size of the inputs behind an
/// element, for results that cancel (sums, means, variances).
fn differ(got: &Host, want: &Host, scale: f64, unordered: bool) -> Option<String> {
    if got.shape != want.shape || got.dtype != want.dtype {
        return Some(format!(
            "shape/dtype {:?} {} vs {:?} {}",
            got.shape, got.dtype, want.shape, want.dtype
        ));
    }
    let tol = tolerance(want.dtype);
    for (i, (g, w)) in got.vals.iter().zip(&want.vals).enumerate() {
        let same = if want.dtype.is_float() {
            let (g, w) = (g.to_f64(), w.to_f64());
            if unordered && scale.is_infinite() && !w.is_finite() && !g.is_finite() {
                // A sum whose terms reach the largest float overflows to ±inf or meets
                // inf - inf (NaN) depending on the order of the additions.
                true
            } else if w.is_nan() || g.is_nan() {
                w.is_nan() && g.is_nan()
            } else if w.is_infinite() || g.is_infinite() {
                g == w
            } else if g == 0.0 && w == 0.0 {
                // A product's sum of signed zeros depends on its first term (cuBLAS starts from
                // the first product, the CPU from +0): unspecified for matmul, as in BLAS.
                unordered || g.is_sign_negative() == w.is_sign_negative()
            } else {
                (g - w).abs() <= tol * w.abs().max(scale)
            }
        } else {
            g == w
        };
        if !same {
            return Some(format!("element {i}: got {g:?}, want {w:?}"));
        }
    }
    None
}

/// The magnitude that a step's result elements may cancel down from.
fn scale_of(step: &Step, input: &Host) -> f64 {
    let max = input.max_finite();
    match step {
        Step::Reduce { op, .. } if matches!(*op, "var" | "std") => {
            max * max * input.vals.len() as f64
        }
        Step::Matmul(rhs) => max * rhs.max_finite().max(1.0) * input.vals.len().max(1) as f64,
        Step::Reduce { .. } | Step::Softmax(..) => max * input.vals.len().max(1) as f64,
        Step::ScatterAdd(..) => max * 8.0,
        // gelu(x) = x·Φ(x) cancels to ±0 in 1 + erf for x ≪ 0, where an erfc form keeps
        // x·Φ(x) (≈ -2e-27 at -11): both are within rounding of |x|.
        Step::Unary("gelu") => max,
        _ => 0.0,
    }
}

/// Where a program went wrong on a device.
struct Failure {
    step: usize,
    why: String,
}

/// Runs `p` on the CPU and `dev` in lockstep (see the module docs).
fn check(p: &Program, dev: &Device) -> std::result::Result<(), Failure> {
    let cpu = Device::cpu();
    let flushes = strata_tests::flushes_subnormals(dev);
    let fail = |step, why: String| Failure { step, why };
    let start = |d: &Device| -> Result<State> {
        let t = p.input.tensor(d)?;
        Ok(State {
            root: t.clone(),
            x: t,
        })
    };
    let (mut cs, mut ds) = match (start(&cpu), start(dev)) {
        (Ok(c), Ok(d)) => (c, d),
        (Ok(_), Err(e)) => return Err(fail(0, format!("the input failed: {e}"))),
        _ => return Ok(()),
    };
    for (i, step) in p.steps.iter().enumerate() {
        let before = (Host::of(&cs.root), ds.clone());
        let input = Host::of(&cs.x).map_err(|e| fail(i, e.to_string()))?;
        let scale = scale_of(step, &input);
        let unordered = matches!(step, Step::Matmul(..));
        // Documented: a device that flushes f32 subnormals differs wherever one is an operand.
        let flushed = |cs: &State| {
            flushes
                && (input.has_f32_subnormal()
                    || Host::of(&cs.x).is_ok_and(|h| h.has_f32_subnormal()))
        };
        let c = step.run(&mut cs, &cpu);
        let d = step.run_reported(&mut ds, dev);
        let compare = |cs: &State, ds: &State| -> Option<String> {
            let host = |t: &Tensor| Host::of(t).map_err(|e| e.to_string());
            match (host(&cs.x), host(&ds.x)) {
                (Ok(w), Ok(g)) => {
                    if let Some(why) = differ(&g, &w, scale, unordered) {
                        return Some(why);
                    }
                }
                (_, Err(e)) | (Err(e), _) => return Some(format!("reading back: {e}")),
            }
            if step.writes() {
                match (host(&cs.root), host(&ds.root)) {
                    (Ok(w), Ok(g)) => {
                        return differ(&g, &w, scale, unordered).map(|w| format!("root {w}"))
                    }
                    (_, Err(e)) | (Err(e), _) => return Some(format!("reading back: {e}")),
                }
            }
            None
        };
        let mismatch = match (&c, &d) {
            (Err(_), Err(_)) => return Ok(()), // both refuse: the program ends
            (Ok(()), Err(e)) => Some(format!("Err on the device only: {e}")),
            (Err(e), Ok(())) => Some(format!("Err on the CPU only: {e}")),
            (Ok(()), Ok(())) => compare(&cs, &ds),
        };
        let Some(why) = mismatch else {
            continue;
        };
        if flushed(&cs) {
            return Ok(());
        }
        // Run the step again on the device from the CPU's exact inputs: a difference carried in
        // from earlier float rounding is not this step's fault.
        let (root_before, ds_before) = before;
        let root_before = root_before.map_err(|e| fail(i, e.to_string()))?;
        let mut retry = ds_before;
        let synced = root_before
            .tensor(dev)
            .and_then(|t| retry.root.assign(&t))
            .and_then(|()| step.run_reported(&mut retry, dev));
        let again = match (&c, synced) {
            (Ok(()), Ok(())) => compare(&cs, &retry),
            (Err(_), Err(_)) => None,
            (_, Err(e)) => Some(format!("Err on the device only: {e}")),
            (Err(e), Ok(())) => Some(format!("Err on the CPU only: {e}")),
        };
        if let Some(why_again) = again {
            return Err(fail(i, format!("{why_again} (first run: {why})")));
        }
        if c.is_err() {
            return Ok(());
        }
        // The step is right from equal inputs: carry on from the CPU's values.
        ds = retry;
    }
    Ok(())
}

/// The smallest program that still fails: steps dropped one at a time while it keeps failing.
fn shrink(mut p: Program, dev: &Device) -> (Program, Failure) {
    let mut failure = check(&p, dev).expect_err("shrinking a failing program");
    p.steps.truncate(failure.step + 1);
    let mut i = 0;
    while i < p.steps.len() {
        let mut smaller = p.clone();
        smaller.steps.remove(i);
        match check(&smaller, dev) {
            Err(f) => {
                smaller.steps.truncate(f.step + 1);
                p = smaller;
                failure = f;
            }
            Ok(()) => i += 1,
        }
    }
    (p, failure)
}

#[test]
fn random_programs_match_the_cpu() {
    let count: u64 = std::env::var("STRATA_RANDOM_PROGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let first: u64 = std::env::var("STRATA_RANDOM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let devices: Vec<Device> = strata_tests::devices();
    // On the CPU alone, each program still runs twice (two CPU devices): a check of the
    // harness and of determinism.
    let mut failures = Vec::new();
    for dev in &devices {
        let subnormals = !strata_tests::flushes_subnormals(dev);
        let started = std::time::Instant::now();
        let mut steps = 0;
        for seed in first..first + count {
            let p = Program::random(seed, subnormals);
            steps += p.steps.len();
            if check(&p, dev).is_err() {
                let (small, f) = shrink(p, dev);
                failures.push(format!(
                    "seed {seed} on {}: step {} fails: {}\n{}",
                    dev.name(),
                    f.step + 1,
                    f.why,
                    small.code(&dev.name())
                ));
                if failures.len() >= 5 {
                    break;
                }
            }
        }
        eprintln!(
            "random programs on {}: {count} programs, {steps} steps, {:.1} s",
            dev.name(),
            started.elapsed().as_secs_f64()
        );
    }
    assert!(
        failures.is_empty(),
        "{} failing programs:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn programs_print_as_strata_code() {
    let p = Program {
        input: Host {
            shape: vec![2],
            dtype: DType::BF16,
            vals: vec![
                Scalar::F64(0.0015).cast(DType::BF16, false),
                Scalar::F64(f64::INFINITY).cast(DType::BF16, false),
            ],
        },
        steps: vec![Step::Binary("floor_divide", Rhs::Float(f64::NEG_INFINITY))],
    };
    let code = p.code("cpu");
    assert!(
        code.contains("let x0 = Tensor::from_slice::<f64>(&[0.0015"),
        "{code}"
    );
    assert!(code.contains(".to_dtype(DType::BF16)?"), "{code}");
    assert!(
        code.contains("let x1 = x0.floor_divide(f64::NEG_INFINITY)?;"),
        "{code}"
    );
}
