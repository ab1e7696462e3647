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

/// Locals already emitted for the nodes of a tree: each node and the name holding its value.
pub type NodeLocals<'e> = Vec<(&'e crate::ir::Expr, String)>;

/// The locals holding each tree of a multi-output map ([`Kernel::Map`](crate::ir::Kernel::Map)
/// with `also`), for a renderer whose `emit` writes a tree's statements and notes every node's
/// local: output 0's tree is emitted in full, and each further tree (an intermediate, so a
/// subtree of it) becomes the local of the node equal to it, or is emitted in full if none is.
/// One rule for every renderer, so a stored intermediate is never computed twice.
///
/// ```
/// use strata_core::{ir::{Expr, Node}, lower::{output_locals, NodeLocals}, DType};
/// let x = Expr::input(0, DType::F32);
/// let trees = [x.clone().cast(DType::F64, false), x];
/// let mut emitted = 0;
/// let locals = output_locals(&trees, |e: &Expr, names: &mut NodeLocals| {
///     if let Node::Cast { arg, .. } = &e.node {
///         names.push((arg, "x0".to_string()));
///     }
///     emitted += 1;
///     names.push((e, "v0".to_string()));
///     Ok("v0".to_string())
/// })?;
/// assert_eq!((emitted, locals), (1, vec!["v0".to_string(), "x0".to_string()]));
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn output_locals<'e>(
    trees: &'e [crate::ir::Expr],
    mut emit: impl FnMut(&'e crate::ir::Expr, &mut NodeLocals<'e>) -> crate::Result<String>,
) -> crate::Result<Vec<String>> {
    let mut names = NodeLocals::new();
    let mut locals = Vec::with_capacity(trees.len());
    for tree in trees {
        let local = match names.iter().find(|(node, _)| *node == tree) {
            Some((_, local)) => local.clone(),
            None => emit(tree, &mut names)?,
        };
        locals.push(local);
    }
    Ok(locals)
}

/// Every output's tree of a multi-output map, output 0 first (what a renderer emits through
/// [`output_locals`]).
///
/// ```
/// use strata_core::{ir::Expr, lower::map_trees, DType};
/// let x = Expr::input(0, DType::F32);
/// assert_eq!(map_trees(&x, &[x.clone()]).len(), 2);
/// ```
pub fn map_trees(expr: &crate::ir::Expr, also: &[crate::ir::Expr]) -> Vec<crate::ir::Expr> {
    std::iter::once(expr).chain(also).cloned().collect()
}
