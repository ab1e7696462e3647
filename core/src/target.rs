//! What a backend tells core about itself, in one place: how wide its vector loads are and
//! what its emitter can do with them, how many threads fill the device, which group sizes a
//! reduction may use, the binding limits its launches must fit, and which kernels it fuses or
//! runs natively. Core's planners and lazy fusion read it ([`Backend::target`]), so core never
//! builds a kernel that a backend would have to split again.
//!
//! [`Backend::target`]: crate::Backend::target

use crate::dtype::DType;

/// A backend's description of itself for the planners ([`map_plan`](crate::lower::map_plan),
/// [`reduce_plan`](crate::lower::reduce_plan), ...) and for lazy fusion.
///
/// ```
/// use strata_core::target::Target;
/// let t = Target::cpu(8);
/// assert_eq!(t.group_sizes, &[1]);
/// assert!(t.binding_limit.is_none() && t.max_bindings.is_none());
/// assert!(t.fuses_map_into_reduce && t.runs_softmax);
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
    /// Bytes a vector may move in a contiguous map whose random draws serve more elements a
    /// Philox call than a plain vector holds, while its outputs still take one store of
    /// `vector_bytes` (CUDA: 32, two `uint4` loads, so stochastic rounding's eight elements a
    /// call share one); 0: vectors stay `vector_bytes`. On a target with
    /// fixed lanes (`vector_lanes`) the count stays, and a contiguous map whose lanes of its
    /// widest dtype exceed `vector_bytes` (64-bit ones) but fit here still takes them where it
    /// draws or where only its outputs are that wide (WGSL, 32: one Philox call serves four
    /// i64 values, and four lanes store as two whole `vec4<u32>`s).
    pub draw_vector_bytes: usize,
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
    /// `vector_rows`.
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
    /// The most tensors (outputs and inputs together) one kernel may bind: wgpu's storage
    /// buffers per shader stage, less the one holding the launch parameters; `None`: no
    /// limit. Lazy fusion keeps every kernel it builds within it.
    pub max_bindings: Option<usize>,
    /// The most outputs one [`Kernel::Map`](crate::ir::Kernel::Map) may write (multi-output
    /// fusion: a fused kernel also stores the intermediates someone still holds); 1:
    /// single-output maps only.
    pub max_map_outputs: usize,
    /// Runs a `Reduce` whose elements are a fused map (`map: Some`); otherwise core runs the
    /// map as its own kernel first.
    pub fuses_map_into_reduce: bool,
    /// Runs a `Reduce` with a row prologue (`prologue: Some`, see
    /// [`RowPrologue`](crate::ir::RowPrologue)), in one pass or as
    /// [`lower::prologue::split`](crate::lower::prologue::split)'s two launches; core then
    /// defers maxima and minima (and sums, see
    /// [`fuses_sum_prologue`](Target::fuses_sum_prologue)) so a following reduction of the same
    /// rows can take them in.
    pub fuses_row_prologue: bool,
    /// Runs a row prologue that sums (`RowPrologue { op: Sum }`), in one pass or as
    /// [`lower::prologue::split`](crate::lower::prologue::split)'s launches: core then defers
    /// float sums of realized tensors over the trailing axes too, so the reduction that
    /// centres the rows by their mean (a layer norm's variance) takes it in. CUDA adds the
    /// terms in the order the eager sum of the row adds them (the same bits); wgpu in its
    /// workgroup's order (the last bits may differ, as its map→reduce fusion's do).
    pub fuses_sum_prologue: bool,
    /// Runs a `Reduce` with a row epilogue (`epilogue: Some`, see
    /// [`RowEpilogue`](crate::ir::RowEpilogue)), in one pass or as
    /// [`lower::prologue::split`](crate::lower::prologue::split)'s launches; core then
    /// defers a fused reduction whose rows it stages with a prologue, so elementwise work over
    /// the same rows that reads its result (softmax from its primitives) joins its kernel.
    pub fuses_row_epilogue: bool,
    /// Stages a fused reduction's rows for a row epilogue without a prologue (rows of at most
    /// [`row_stage_bytes`](Target::row_stage_bytes)): core then defers every fused reduction
    /// over the trailing axes whose rows fit, so elementwise work over the same rows that
    /// reads its result (softmax's backward, `y·(g − Σ g·y)`) joins its kernel.
    pub stages_row_epilogue_alone: bool,
    /// Runs a `Reduce` that also stores its map's values (`stores_map: true`): core then
    /// defers every fused reduction of a pending tree, so that when the tree itself is read
    /// (the gradient a bias's column sum and then a matmul read) one kernel computes both.
    pub stores_reduce_map: bool,
    /// Runs [`Kernel::Softmax`](crate::ir::Kernel::Softmax); otherwise core runs `softmax` as
    /// its composition (a max, a fused sum, a map).
    pub runs_softmax: bool,
    /// The longest row (in elements) this backend runs
    /// [`Kernel::LayerNorm`](crate::ir::Kernel::LayerNorm) and
    /// [`Kernel::LayerNormBackward`](crate::ir::Kernel::LayerNormBackward) over; 0: none, and
    /// core composes a layer norm from reductions and maps (a fused kernel forward, five
    /// passes over the rows backward, where the kernels make one each).
    pub layer_norm_row: usize,
    /// The dtypes it runs those kernels for.
    pub layer_norm_dtypes: &'static [DType],
    /// The dtypes this backend runs [`Kernel::ChannelMoments`](crate::ir::Kernel::ChannelMoments)
    /// for (batch norm's statistics in one read); for the others core takes them in two
    /// reductions (the mean, then the variance around it: two reads).
    pub channel_moments_dtypes: &'static [DType],
    /// The dtypes this backend runs
    /// [`Kernel::ChannelGradSums`](crate::ir::Kernel::ChannelGradSums) for (batch norm's
    /// backward sums in one read); for the others core takes two reductions (`Σg`, then
    /// `Σg·x̂`).
    pub channel_sums_dtypes: &'static [DType],
    /// The output dtypes this backend runs [`Kernel::Histogram`](crate::ir::Kernel::Histogram)
    /// into; for the others core counts each bin as a sum over a one-hot comparison (`bins · n`
    /// work: right, but slow for many bins).
    pub histogram_accumulators: &'static [DType],
    /// The 16-bit float dtypes (f16, bf16) whose [`Kernel::Matmul`](crate::ir::Kernel::Matmul)
    /// runs faster on f32 copies of its operands: core then widens A and B (and C when β ≠ 0),
    /// runs the f32 product and rounds it into C. The numbers are the same (the half kernel also
    /// accumulates in f32 and rounds once); the copies cost memory and three elementwise passes.
    pub widens_half_matmul: &'static [DType],
    /// TF32 products of at least this many multiply-adds (`batch·m·n·k`) whose operands are
    /// both laid out along `m` and `n` (A column-major, B row-major: a weight's gradient
    /// `xᵀ·dy`) run faster when core first copies the smaller one contiguous along `k`: cuBLAS's
    /// Hopper TF32 kernels read neither operand along `k` then, at about 60% of their rate.
    /// (The smaller operand unless it is broadcast along the batch.) `None`: products run on
    /// their operands as they are.
    pub k_major_tf32_from: Option<u64>,
}

impl Target {
    /// The CPU reference backend: no vectors in the plan (its inner loops vectorize on their
    /// own), one thread per output or split, `threads` threads.
    ///
    /// ```
    /// assert_eq!(strata_core::target::Target::cpu(4).parallel_slots, 4);
    /// ```
    pub fn cpu(threads: usize) -> Target {
        Target {
            vector_bytes: 0,
            vector_lanes: 0,
            draw_vector_bytes: 0,
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
            max_bindings: None,
            max_map_outputs: 8,
            fuses_map_into_reduce: true,
            fuses_row_prologue: true,
            fuses_sum_prologue: true,
            fuses_row_epilogue: true,
            stages_row_epilogue_alone: false,
            stores_reduce_map: true,
            runs_softmax: true,
            layer_norm_row: usize::MAX,
            layer_norm_dtypes: &[DType::F16, DType::BF16, DType::F32, DType::F64],
            channel_moments_dtypes: &[DType::F16, DType::BF16, DType::F32, DType::F64],
            channel_sums_dtypes: &[DType::F16, DType::BF16, DType::F32, DType::F64],
            histogram_accumulators: &[DType::U32, DType::U64, DType::F32, DType::F64],
            widens_half_matmul: &[],
            k_major_tf32_from: None,
        }
    }

    /// True when a kernel binding `tensors` tensors (outputs and inputs) fits
    /// [`max_bindings`](Target::max_bindings).
    ///
    /// ```
    /// use strata_core::target::Target;
    /// let t = Target { max_bindings: Some(7), ..Target::cpu(1) };
    /// assert!(t.binds(7) && !t.binds(8));
    /// assert!(Target::cpu(1).binds(1000));
    /// ```
    pub fn binds(&self, tensors: usize) -> bool {
        self.max_bindings.is_none_or(|m| tensors <= m)
    }

    /// True when a reduction reading `inputs` tensors (a fused map's leaves) fits the binding
    /// limits: its output and the positions a split argmin or argmax keeps bind too, and each
    /// input beyond the first, bound whole, spans `bytes[k]` bytes within
    /// [`binding_limit`](Target::binding_limit).
    ///
    /// ```
    /// use strata_core::target::Target;
    /// let t = Target { max_bindings: Some(7), binding_limit: Some(1 << 20), ..Target::cpu(1) };
    /// assert!(t.binds_reduce(&[64, 64, 64]));
    /// assert!(!t.binds_reduce(&[64, 2 << 20]));
    /// assert!(!t.binds_reduce(&[64; 6]));
    /// ```
    pub fn binds_reduce(&self, bytes: &[usize]) -> bool {
        let whole = |&b: &usize| self.binding_limit.is_none_or(|l| b as u64 <= l);
        self.binds(bytes.len() + 2) && bytes.iter().skip(1).all(whole)
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
