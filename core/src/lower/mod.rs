//! The lowering layer, between the kernel IR ([`crate::ir`]) and the backends: everything a
//! backend would otherwise decide on its own, written once. Which `(op, dtype)` pairs exist and
//! their canonical forms ([`legal`]), the operand checks of every kernel kind ([`operands`]),
//! the launch plans of maps and reductions computed from the [`Target`](target::Target) each
//! backend describes ([`map_plan`], [`reduce_plan`], the row path of gathers in
//! [`index_plan`], softmax's rows in [`softmax_plan`]), a reduction with a row prologue as two
//! launches ([`prologue`]), splitting launches into pieces under a
//! binding limit ([`pieces`]), and the kernel-cache type both GPU backends use ([`cache`]). A
//! backend turns a plan into source, packs its arguments and runs it.
//!
//! ```
//! use strata_core::lower::legal::{binary_rule, Rule};
//! use strata_core::{ir::BinaryOp, DType};
//! assert_eq!(binary_rule(BinaryOp::Mul, DType::Bool), Rule::Binary(BinaryOp::BitAnd));
//! ```

pub mod cache;
pub mod index_plan;
pub mod legal;
pub mod map_plan;
pub mod operands;
pub mod pieces;
pub mod program;
pub mod prologue;
pub mod reduce_plan;
pub mod softmax_plan;
pub mod target;

/// A list of extents on the launch path, inline up to 6 axes (coalesced layouts rarely have
/// more): a plan is made on every launch, and a one-element op costs a few microseconds in
/// all, so planning must not allocate per axis list.
///
/// ```
/// let d: strata_core::lower::Dims = [2usize, 3].into_iter().collect();
/// assert!(!d.spilled());
/// ```
pub type Dims = smallvec::SmallVec<[usize; 6]>;

/// Strides on the launch path, inline like [`Dims`].
///
/// ```
/// let s: strata_core::lower::Strides = smallvec::smallvec![3, 1];
/// assert_eq!(&s[..], &[3, 1]);
/// ```
pub type Strides = smallvec::SmallVec<[isize; 6]>;
