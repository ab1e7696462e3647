//! What a backend tells the planners about itself: how wide its vector loads are and what its
//! emitter can do with them, how many threads fill the device, which group sizes a reduction
//! may use, and the storage-binding limit its launches must fit.

/// A backend's description of itself for [`map_plan`](super::map_plan) and
/// [`reduce_plan`](super::reduce_plan).
///
/// ```
/// use strata_core::lower::target::Target;
/// let t = Target::cpu(8);
/// assert_eq!(t.group_sizes, &[1]);
/// assert!(t.binding_limit.is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Bytes one vector load or store moves (16: `uint4`, `vec4<u32>`); 0 for none.
    pub vector_bytes: usize,
    /// Elements per vector where the target fixes the count (WGSL: four, each operand's in
    /// `u32` words: `vec4<u32>` for 32-bit dtypes, `vec2<u32>` for 16-bit ones, one `u32` for
    /// 8-bit ones, so a cast to f16 writes whole words); operands wider than `vector_bytes`
    /// over it take no vectors. 0: `vector_bytes` over the widest operand's size.
    pub vector_lanes: usize,
    /// A vectorized launch handles a tail of fewer than a vector's elements, and narrower
    /// vectors when the operands' alignment asks for them; without it the vector is all or
    /// nothing (the element count a multiple of it).
    pub vector_tail: bool,
    /// The tiled map path (a 2-D map whose inputs run down the columns passes them through
    /// 32×32 tiles) takes only 32-bit dtypes.
    pub tile_32bit_only: bool,
    /// The tiled map path may read the element's position (arange, random numbers).
    pub tile_reads_position: bool,
    /// A vectorized map may take strided operands when whole vectors fit in a row: inputs
    /// constant along the innermost axis (a row or column broadcast: stride 0 there), read
    /// once per vector, and operands contiguous along it (stride 1: a slice of rows, one part
    /// of a `cat`), read or written a whole vector at the offset decoded for its first element.
    pub vector_rows: bool,
    /// A vectorized map may take inputs constant along the innermost axis (stride 0 there: a
    /// row broadcast such as softmax's `[n, 1]` values) when whole vectors fit in a row, one
    /// value per vector read at the offset decoded for the vector's first element. Implied by
    /// `vector_rows`; a target that binds windows may have it without `vector_rows`.
    pub vector_splats: bool,
    /// 64-bit index arithmetic is available (else every offset and count of a launch must
    /// fit 32 bits, which the binding limit guarantees for offsets).
    pub wide_index: bool,
    /// Threads that keep the device busy: a reduction with fewer outputs than this splits its
    /// extent until there are enough.
    pub parallel_slots: usize,
    /// Elements a thread of a reduction folds at least before its extent is split further.
    pub items_per_thread: usize,
    /// Threads that may reduce one output together, smallest first (1: a thread per output).
    pub group_sizes: &'static [usize],
    /// Threads that may share one row of a softmax, smallest first (the largest is a block;
    /// a row group of more than one block's worth is not allowed).
    pub row_groups: &'static [usize],
    /// The longest softmax row, in bytes, a group keeps in shared memory between its passes
    /// (read from memory once; rows too long for registers); 0: none.
    pub row_stage_bytes: usize,
    /// Threads that share a row kept in shared memory.
    pub row_stage_group: usize,
    /// Vector loads of a contiguous reduced axis.
    pub reduce_vectors: bool,
    /// The most bytes one operand may bind (wgpu's storage-binding limit); `None`: no limit.
    pub binding_limit: Option<u64>,
    /// Bindings start at multiples of this many bytes.
    pub offset_align: u64,
}

impl Target {
    /// The CPU reference backend: no vectors in the plan (its inner loops vectorize on their
    /// own), one thread per output or split, `threads` threads.
    ///
    /// ```
    /// assert_eq!(strata_core::lower::target::Target::cpu(4).parallel_slots, 4);
    /// ```
    pub fn cpu(threads: usize) -> Target {
        Target {
            vector_bytes: 0,
            vector_lanes: 0,
            vector_tail: true,
            tile_32bit_only: false,
            tile_reads_position: true,
            vector_rows: false,
            vector_splats: false,
            wide_index: true,
            parallel_slots: threads.max(1),
            items_per_thread: 2048,
            group_sizes: &[1],
            row_groups: &[1],
            row_stage_bytes: 0,
            row_stage_group: 1,
            reduce_vectors: false,
            binding_limit: None,
            offset_align: 1,
        }
    }

    /// The group size of `at_least` threads or more (the largest there is when none is).
    pub(crate) fn group_of(&self, at_least: usize) -> usize {
        let largest = *self.group_sizes.last().unwrap_or(&1);
        self.group_sizes
            .iter()
            .copied()
            .find(|&g| g >= at_least)
            .unwrap_or(largest)
    }
}
