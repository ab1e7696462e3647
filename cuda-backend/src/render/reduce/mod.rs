//! `Reduce` kernels. Each output element is reduced by a *group* of 1, 32 (a warp, combined
//! with shuffles) or 256 threads (a block, through shared memory); a long reduction is split
//! into slices whose partial results a second, "combine" launch reduces. The group size
//! follows the layout: a contiguous reduced axis gets a warp or a block per output (coalesced
//! reads), a strided one a thread per output (neighbouring outputs are neighbours in memory).
//! Contiguous reduced axes are read 16 bytes at a time, so a short innermost axis (length 4)
//! still streams at full bandwidth.
//!
//! `plain` writes a reduction's kernel, `columns` one whose threads each walk neighbouring
//! columns (a column sum that stores its map), `staged` one with a row prologue
//! ([`StagedPrologue`]) or a row epilogue ([`StagedEpilogue`]) whose row waits in shared
//! memory (`per_warp` where the eager group is a warp: each warp its own rows), `held` one with a prologue whose row waits in registers (a block's lanes in one
//! range); `parts` holds the pieces they share (the accumulator's representation, the argument
//! words, the group combine).

mod columns;
pub(crate) mod held;
mod parts;
pub(crate) mod per_warp;
mod plain;
mod row_values;
pub(crate) mod staged;

pub(crate) use parts::{repr, Words};

use super::{Generated, Rendered};
use strata_core::ir::ReduceOp;
use strata_core::lower::operands::ReduceMap;
use strata_core::{DType, Result};

/// The structure of a reduce launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ReduceSig {
    pub op: ReduceOp,
    /// The element dtype read (in a combine launch, the partials' dtype).
    pub input: DType,
    pub acc: DType,
    pub out: DType,
    pub outer_rank: usize,
    pub reduced_rank: usize,
    /// Threads per output: 1, 32 or 256.
    pub group: usize,
    /// Elements per vector load (1: none).
    pub vector: usize,
    pub wide: bool,
    /// Reads partials (values and, for arg ops, indices) of an earlier launch.
    pub combine: bool,
    /// Map→reduce fusion: the element is this map over inputs of one layout.
    pub map: Option<ReduceMap>,
    /// A row prologue computed first with each row kept in shared memory (a block of
    /// [`STAGE_GROUP`](super::softmax::STAGE_GROUP) threads a row): see `staged`.
    pub prologue: Option<StagedPrologue>,
    /// Elementwise work over the staged row that reads the result, run last (the row is
    /// staged for it, with a prologue or without): see `staged`.
    pub epilogue: Option<StagedEpilogue>,
    /// A staged reduction with a prologue whose rows are held in registers instead of shared
    /// memory (one range, a block's group, at most [`held::VECTORS`] vectors a thread): see
    /// `held`.
    pub held: bool,
    /// The map's value at every element is stored too, in a further output laid out like
    /// input 0 (its pointer the last argument word): `Kernel::Reduce { stores_map }`.
    pub stores_map: bool,
    /// Neighbouring outputs a thread reduces together (1: one): a column sum that stores its
    /// map, each thread walking `out_vector` neighbouring columns with vector loads and
    /// stores (`columns`).
    pub out_vector: usize,
}

impl strata_core::kernel_cache::Owned for ReduceSig {}

impl ReduceSig {
    /// True when this staged reduction gives each warp its own rows (`per_warp`): the eager
    /// plan's group is a warp.
    pub(crate) fn staged_by_warps(&self) -> bool {
        self.group == 32 && !self.held && (self.prologue.is_some() || self.epilogue.is_some())
    }
}

/// The prologue of a staged reduction: what it folds, and the map input that reads its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StagedPrologue {
    pub op: ReduceOp,
    pub result: usize,
    /// The dtype it is written in (output 1's).
    pub out: DType,
}

/// The epilogue of a staged reduction ([`RowEpilogue`](strata_core::ir::RowEpilogue)): its
/// expression over the reduction's inputs, the input that reads the result, and the dtype it
/// writes (the last output, laid out like input 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StagedEpilogue {
    pub expr: strata_core::ir::Expr,
    pub result: usize,
    pub out: DType,
}

impl Generated for ReduceSig {
    const NAME: &'static str = "strata_reduce";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(if self.held {
            held::source(self)?
        } else if self.out_vector > 1 {
            columns::source(self)?
        } else if self.staged_by_warps() {
            per_warp::source(self)?
        } else if self.prologue.is_some() || self.epilogue.is_some() {
            staged::source(self)?
        } else {
            plain::source(self)?
        }))
    }
}
