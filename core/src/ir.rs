//! The kernel IR: what core asks a backend to run. Core builds it with every dtype decided
//! and every operand broadcast to the output's shape, so a backend only compiles and runs it.
//!
//! A kernel's *structure* (this module's types) is what a backend compiles and caches; sizes,
//! strides, offsets and scalar values arrive at launch time in [`KernelArgs`].

use crate::backend::DeviceBuffer;
use crate::dtype::{DType, Scalar};
use crate::layout::Layout;
use std::sync::Arc;

/// A typed expression tree evaluated once per output element of a [`Kernel::Map`].
///
/// Every node's value is rounded to its own `dtype` (so `f16` trees round after each node).
/// Operand dtypes follow the rules given on [`BinaryOp`]; core inserts the casts.
///
/// ```
/// use strata_core::{DType, ir::{BinaryOp, Expr}};
/// // out = in0 + scalar0, in f32
/// let e = Expr::binary(BinaryOp::Add, Expr::input(0, DType::F32), Expr::scalar(0, DType::F32));
/// assert_eq!(e.dtype, DType::F32);
/// assert_eq!(e.max_input(), Some(0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Expr {
    /// The dtype of this node's value.
    pub dtype: DType,
    /// What the node computes.
    pub node: Node,
}

/// The kinds of [`Expr`] node.
///
/// ```
/// use strata_core::{DType, ir::{Expr, Node}};
/// assert_eq!(Expr::linear_index().node, Node::LinearIndex);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Node {
    /// Input tensor `k`, read at the output element's index (inputs have the output's shape,
    /// broadcast through stride-0 axes).
    Input(usize),
    /// Launch scalar `k` (its value is an argument, not part of the compiled kernel).
    Scalar(usize),
    /// The row-major position of the output element, as `i64`.
    LinearIndex,
    /// Converts the operand to this node's dtype with strata's cast rules
    /// ([`Scalar::cast`](crate::Scalar::cast)): integers wrap, or clamp when `saturate`.
    Cast {
        /// The value to convert.
        arg: Box<Expr>,
        /// Clamp integer results to the target range instead of wrapping.
        saturate: bool,
    },
    /// A binary operation.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `cond ? a : b`; `cond` is `bool`, `a` and `b` have this node's dtype.
    Where(Box<Expr>, Box<Expr>, Box<Expr>),
}

/// Binary operations of the IR. Both operands have the same dtype; arithmetic returns it,
/// comparisons return `bool`.
///
/// ```
/// use strata_core::ir::BinaryOp;
/// assert!(BinaryOp::Lt.is_comparison());
/// assert!(!BinaryOp::Add.is_comparison());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`; integers wrap.
    Add,
    /// `a - b`; integers wrap.
    Sub,
    /// `a * b`; integers wrap.
    Mul,
    /// `a / b` for floats (IEEE).
    Div,
    /// `a < b` (false when either is NaN).
    Lt,
}

impl BinaryOp {
    /// True when the result is `bool`.
    ///
    /// ```
    /// assert!(strata_core::ir::BinaryOp::Lt.is_comparison());
    /// ```
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Lt)
    }
}

impl Expr {
    /// Input tensor `k` of dtype `dtype`.
    ///
    /// ```
    /// let e = strata_core::ir::Expr::input(1, strata_core::DType::U8);
    /// assert_eq!(e.max_input(), Some(1));
    /// ```
    pub fn input(k: usize, dtype: DType) -> Expr {
        Expr {
            dtype,
            node: Node::Input(k),
        }
    }

    /// Launch scalar `k` of dtype `dtype`.
    ///
    /// ```
    /// let e = strata_core::ir::Expr::scalar(0, strata_core::DType::F64);
    /// assert_eq!(e.dtype, strata_core::DType::F64);
    /// ```
    pub fn scalar(k: usize, dtype: DType) -> Expr {
        Expr {
            dtype,
            node: Node::Scalar(k),
        }
    }

    /// The output element's row-major position, `i64`.
    ///
    /// ```
    /// assert_eq!(strata_core::ir::Expr::linear_index().dtype, strata_core::DType::I64);
    /// ```
    pub fn linear_index() -> Expr {
        Expr {
            dtype: DType::I64,
            node: Node::LinearIndex,
        }
    }

    /// `self` converted to `dtype` (no node when it already has it).
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// assert_eq!(Expr::linear_index().cast(DType::F32, false).dtype, DType::F32);
    /// ```
    pub fn cast(self, dtype: DType, saturate: bool) -> Expr {
        if self.dtype == dtype {
            return self;
        }
        Expr {
            dtype,
            node: Node::Cast {
                arg: Box::new(self),
                saturate,
            },
        }
    }

    /// `op(lhs, rhs)`; the operands must share a dtype.
    ///
    /// ```
    /// use strata_core::{DType, ir::{BinaryOp, Expr}};
    /// let e = Expr::binary(BinaryOp::Lt, Expr::input(0, DType::I8), Expr::input(1, DType::I8));
    /// assert_eq!(e.dtype, DType::Bool);
    /// ```
    pub fn binary(op: BinaryOp, lhs: Expr, rhs: Expr) -> Expr {
        debug_assert_eq!(lhs.dtype, rhs.dtype, "core casts operands to one dtype");
        let dtype = if op.is_comparison() {
            DType::Bool
        } else {
            lhs.dtype
        };
        Expr {
            dtype,
            node: Node::Binary(op, Box::new(lhs), Box::new(rhs)),
        }
    }

    /// `cond ? a : b`.
    ///
    /// ```
    /// use strata_core::{DType, ir::Expr};
    /// let e = Expr::select(Expr::input(0, DType::Bool), Expr::scalar(0, DType::F32), Expr::scalar(1, DType::F32));
    /// assert_eq!(e.dtype, DType::F32);
    /// ```
    pub fn select(cond: Expr, a: Expr, b: Expr) -> Expr {
        Expr {
            dtype: a.dtype,
            node: Node::Where(Box::new(cond), Box::new(a), Box::new(b)),
        }
    }

    /// The highest input index the tree reads, if any.
    ///
    /// ```
    /// assert_eq!(strata_core::ir::Expr::linear_index().max_input(), None);
    /// ```
    pub fn max_input(&self) -> Option<usize> {
        match &self.node {
            Node::Input(k) => Some(*k),
            Node::Scalar(_) | Node::LinearIndex => None,
            Node::Cast { arg, .. } => arg.max_input(),
            Node::Binary(_, a, b) => a.max_input().max(b.max_input()),
            Node::Where(c, a, b) => c.max_input().max(a.max_input()).max(b.max_input()),
        }
    }
}

/// A unit of work for a backend.
///
/// ```
/// use strata_core::{DType, ir::{Expr, Kernel}};
/// let copy = Kernel::Map { expr: Expr::input(0, DType::F32) };
/// assert!(matches!(copy, Kernel::Map { .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Writes `expr` to every element of output 0. Fill (a scalar), arange (the linear index),
    /// strided copy (one input) and cast are all maps.
    Map {
        /// The value of each output element; its dtype is the output's.
        expr: Expr,
    },
}

/// One tensor operand of a launch: a buffer and the view of it to use.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let t = Tensor::zeros([2], DType::F32, &Device::cpu()).unwrap();
/// let op = t.operand();
/// assert_eq!(op.layout.shape(), &[2]);
/// ```
#[derive(Debug, Clone)]
pub struct Operand {
    /// The storage.
    pub buffer: Arc<dyn DeviceBuffer>,
    /// Shape, strides (in elements) and offset of the view.
    pub layout: Layout,
    /// The element type.
    pub dtype: DType,
}

/// The run-time arguments of a launch: outputs, inputs and scalar values.
///
/// ```
/// use strata_core::{ir::KernelArgs, Scalar};
/// let args = KernelArgs { outputs: vec![], inputs: vec![], scalars: vec![Scalar::F32(1.0)] };
/// assert_eq!(args.scalars.len(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct KernelArgs {
    /// Tensors written. A `Map` has exactly one; inputs have its shape.
    pub outputs: Vec<Operand>,
    /// Tensors read.
    pub inputs: Vec<Operand>,
    /// Scalar values, each of the dtype its `Node::Scalar` node says.
    pub scalars: Vec<Scalar>,
}
