//! The lowering layer, between the kernel IR ([`crate::ir`]) and the backends: everything a
//! backend would otherwise decide on its own, written once. Which `(op, dtype)` pairs exist and
//! their canonical forms ([`legal`]), the operand checks of every kernel kind ([`operands`]),
//! the launch plans of maps and reductions computed from the [`Target`](crate::target::Target) each
//! backend describes ([`map_plan`], [`reduce_plan`], the row path of gathers in
//! [`index_plan`], softmax's rows in [`softmax_plan`], layer norm in [`layer_norm_plan`], batch norm's statistics in [`moments_plan`]), a reduction with a row prologue as two
//! launches ([`prologue`]), splitting launches into pieces under a
//! binding limit ([`pieces`]), each map's trees as one list of instructions
//! ([`program`]), and the values of a row's expression computed once a row ([`row_values`]). A backend turns a plan into source, packs its arguments and runs it.
//!
//! ```
//! use strata_core::lower::legal::{binary_rule, Rule};
//! use strata_core::{ir::BinaryOp, DType};
//! assert_eq!(binary_rule(BinaryOp::Mul, DType::Bool), Rule::Binary(BinaryOp::BitAnd));
//! ```

pub mod conv_plan;
pub mod histogram_plan;
pub mod index_plan;
pub mod layer_norm_plan;
pub mod legal;
pub mod map_plan;
pub mod moments_plan;
pub mod operands;
pub mod pieces;
pub mod program;
pub mod prologue;
pub mod reduce_plan;
pub mod row_values;
pub mod softmax_plan;
