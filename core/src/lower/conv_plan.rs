//! A convolution pass as an implicit GEMM: one product per channel group whose operands are
//! read straight from the tensors (no im2col buffer: each tile of the product gathers its
//! values as it loads them, zero in the padding). A backend without a convolution library
//! (wgpu) renders this plan; the CPU runs direct loops, CUDA cuDNN.
//!
//! | pass | rows | columns | depth | A (gathered) | B |
//! |---|---|---|---|---|---|
//! | forward | samples·OH·OW | O/g | C/g·kH·kW | `x` at each tap | `w` |
//! | backward data, per stride phase | samples·⌈H/s⌉·⌈W/s⌉ | C/g | O/g·(the phase's taps) | `dy` | `w` |
//! | backward filter | O/g | C/g·kH·kW | samples·OH·OW | `dy` | `x` at each tap |
//!
//! Backward data runs one product per stride phase ([`ConvPhase`]): the input pixels
//! `(ph + s0·i, pw + s1·j)` and only the taps whose windows land on them, so no gather tests
//! whether the stride lands (a stride-2 7×7 backward data did three tests in four for
//! nothing) and every term read is a term of the sum.
//!
//! The batch splits into pieces whose operands fit one binding (`Target::binding_limit`).
//! Backward filter's depth runs over the samples, so its product has few outputs and a long
//! sum: it splits the samples further into ranges ([`ConvPlan::per_split`] samples each) that
//! write partial products, summed in a second pass — enough ranges to keep the device busy.
//!
//! ```
//! use strata_core::ir::{ConvGeometry, ConvPass};
//! use strata_core::lower::conv_plan::{ConvDims, ConvPlan};
//! use strata_core::target::Target;
//! let g = ConvGeometry { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 };
//! // x [64, 64, 56, 56], w [64, 64, 3, 3] → dw: 64 rows, 576 columns, 64·56² deep.
//! let d = ConvDims::of(ConvPass::BackwardFilter, &[64, 64, 56, 56], &[64, 64, 56, 56], &[64, 64, 3, 3])?;
//! assert_eq!(d.gemm(ConvPass::BackwardFilter, 1, 64), [64, 576, 64 * 56 * 56]);
//! // On a device that wants 1,024 workgroups: 9 tiles a range, a range a sample.
//! let mut t = Target::cpu(8);
//! t.parallel_slots = 1 << 18;
//! let plan = ConvPlan::of(ConvPass::BackwardFilter, &g, d, &t, 4, [4; 3])?;
//! assert_eq!((plan.tile, plan.partials, plan.pieces.len()), ([64, 64], 64, 1));
//! # Ok::<(), strata_core::Error>(())
//! ```

use crate::error::{Error, Result};
use crate::ir::{ConvGeometry, ConvPass};
use crate::target::Target;

/// The tiles of the product (rows, columns) a workgroup of 256 threads may compute, each
/// thread a [`per_thread`] square block of it: 4×4 in the 64×64 tile and in the tall and wide
/// ones for products of few columns or rows (a backward-data pass into 3 channels), 8×8 in the
/// large ones (twice the multiply-adds per value read from shared memory).
pub const TILES: [[usize; 2]; 6] = [
    [64, 64],
    [128, 128],
    [256, 64],
    [64, 256],
    [256, 16],
    [16, 256],
];

/// The side of the block of a tile each of its 256 threads computes.
///
/// ```
/// use strata_core::lower::conv_plan::per_thread;
/// assert_eq!((per_thread([64, 64]), per_thread([256, 64]), per_thread([16, 256])), (4, 8, 4));
/// ```
pub fn per_thread([tm, tn]: [usize; 2]) -> usize {
    ((tm * tn / 256) as f64).sqrt().round() as usize
}

/// The tile of [`TILES`] for a `rows` × `cols` product in `groups` groups: the least padding,
/// and of those the largest tile that still makes `workgroups` tiles (a device's worth),
/// else the one that makes the most (the first of [`TILES`] among equals: square before
/// tall or wide, whose gathers cost more per multiply-add).
///
/// ```
/// use strata_core::lower::conv_plan::tile_for;
/// assert_eq!(tile_for(64, 576, 1, 256), [64, 64]);
/// assert_eq!(tile_for(200_704, 64, 1, 256), [256, 64]);
/// assert_eq!(tile_for(3_211_264, 3, 1, 256), [256, 16]);
/// assert_eq!(tile_for(8, 4096, 1, 256), [16, 256]);
/// // Every tile fits 12,544 × 256 exactly; none makes 1,056 tiles: the square 64×64 (784).
/// assert_eq!(tile_for(12_544, 256, 1, 1056), [64, 64]);
/// ```
pub fn tile_for(rows: usize, cols: usize, groups: usize, workgroups: usize) -> [usize; 2] {
    let padded = |[tm, tn]: [usize; 2]| rows.div_ceil(tm) * tm * cols.div_ceil(tn) * tn;
    let count = |[tm, tn]: [usize; 2]| rows.div_ceil(tm) * cols.div_ceil(tn) * groups;
    let least = TILES.into_iter().map(padded).min().unwrap_or(0);
    let mut fits: Vec<[usize; 2]> = TILES.into_iter().filter(|&t| padded(t) == least).collect();
    // Largest first (the order of TILES breaks ties).
    fits.sort_by_key(|&t| std::cmp::Reverse(per_thread(t)));
    if let Some(&t) = fits.iter().find(|&&t| count(t) >= workgroups) {
        return t;
    }
    let most = fits.iter().map(|&t| count(t)).max().unwrap_or(0);
    TILES
        .into_iter()
        .find(|&t| fits.contains(&t) && count(t) == most)
        .unwrap_or(TILES[0])
}

/// The sizes of a convolution: input `[n, c, h, w]`, weight `[o, c / groups, kh, kw]`, output
/// `[n, o, oh, ow]`, whichever pass reads or writes them.
///
/// ```
/// use strata_core::{ir::ConvPass, lower::conv_plan::ConvDims};
/// // backward data: dy [2, 8, 4, 4] and w [8, 3, 3, 3] → dx [2, 3, 6, 6].
/// let d = ConvDims::of(ConvPass::BackwardData, &[2, 8, 4, 4], &[8, 3, 3, 3], &[2, 3, 6, 6])?;
/// assert_eq!((d.n, d.c, d.h, d.o, d.kh, d.oh), (2, 3, 6, 8, 3, 4));
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvDims {
    /// Samples.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub o: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
}

impl ConvDims {
    /// The sizes of `pass` from its operands' shapes: its two inputs `a`, `b` (`[x, w]`,
    /// `[dy, w]` or `[x, dy]`) and its output `out`.
    pub fn of(pass: ConvPass, a: &[usize], b: &[usize], out: &[usize]) -> Result<ConvDims> {
        let (&[a0, a1, a2, a3], &[b0, b1, b2, b3], &[_, o1, o2, o3]) = (a, b, out) else {
            return Err(Error::Backend(format!(
                "internal error: a {} of shapes {a:?}, {b:?} into {out:?} (4-D expected)",
                pass.name()
            )));
        };
        let [n, c, h, w, o, kh, kw, oh, ow] = match pass {
            ConvPass::Forward => [a0, a1, a2, a3, b0, b2, b3, o2, o3],
            ConvPass::BackwardData => [a0, o1, o2, o3, a1, b2, b3, a2, a3],
            ConvPass::BackwardFilter => [a0, a1, a2, a3, b1, o2, o3, b2, b3],
        };
        Ok(ConvDims {
            n,
            c,
            h,
            w,
            o,
            kh,
            kw,
            oh,
            ow,
        })
    }

    /// Rows, columns and depth of one group's product over `samples` samples (see the module's
    /// table).
    pub fn gemm(&self, pass: ConvPass, groups: usize, samples: usize) -> [usize; 3] {
        let (cg, og, taps) = (self.c / groups, self.o / groups, self.kh * self.kw);
        match pass {
            ConvPass::Forward => [samples * self.oh * self.ow, og, cg * taps],
            ConvPass::BackwardData => [samples * self.h * self.w, cg, og * taps],
            ConvPass::BackwardFilter => [og, cg * taps, samples * self.oh * self.ow],
        }
    }

    /// Elements one sample holds in the input (`x` or `dx`) and in the output (`y` or `dy`).
    fn per_sample(&self) -> [usize; 2] {
        [self.c * self.h * self.w, self.o * self.oh * self.ow]
    }
}

/// A range of samples that one launch of the product covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvPiece {
    /// The first sample.
    pub first: usize,
    /// How many.
    pub samples: usize,
    /// Backward filter: the ranges of [`ConvPlan::per_split`] samples (the last shorter) whose
    /// partial products this launch writes, from partial `first / per_split` on; 1 for the
    /// other passes.
    pub splits: usize,
    /// Backward filter: the piece continues a range an earlier piece began (a range longer
    /// than a binding holds), so it adds to that partial instead of writing it.
    pub accumulate: bool,
}

/// How a convolution pass runs as implicit GEMMs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvPlan {
    /// The sizes.
    pub dims: ConvDims,
    /// The launches of the product, in order.
    pub pieces: Vec<ConvPiece>,
    /// The tile a workgroup computes (rows, columns; one of [`TILES`]).
    pub tile: [usize; 2],
    /// Backward filter: samples per partial product (the whole batch for the other passes).
    pub per_split: usize,
    /// Backward filter: the partial products (`[partials, O, C/g, kH, kW]` in the accumulator's
    /// dtype) summed into the output afterwards; 0 for the other passes, which write the
    /// output directly.
    pub partials: usize,
}

impl ConvPlan {
    /// The plan of `pass` over operands of sizes `dims` on `target`, accumulating in
    /// `acc_bytes`-byte values; `itemsizes` are the bytes per element of the output and the
    /// two inputs. An `Err` when one sample or the weight exceeds a binding.
    pub fn of(
        pass: ConvPass,
        geometry: &ConvGeometry,
        dims: ConvDims,
        target: &Target,
        acc_bytes: usize,
        itemsizes: [usize; 3],
    ) -> Result<ConvPlan> {
        let groups = geometry.groups.max(1);
        let limit = target.binding_limit.unwrap_or(u64::MAX);
        // A window may start up to one alignment before its first element.
        let room = limit.saturating_sub(target.offset_align) as u128;
        let item = *itemsizes.iter().max().unwrap_or(&4) as u128;
        let [input, output] = dims.per_sample();
        let weight = (dims.o * (dims.c / groups) * dims.kh * dims.kw) as u128;
        let too_big = |what: &str, elements: u128| {
            Error::Unsupported(format!(
                "wgpu: {what} of a {} ({elements} elements) exceeds the adapter's {limit}-byte \
                 storage binding; use the CPU or CUDA backend",
                pass.name()
            ))
        };
        if weight * item > room {
            return Err(too_big("the weight", weight));
        }
        let sample = input.max(output) as u128 * item;
        if sample > room {
            return Err(too_big("one sample", input.max(output) as u128));
        }
        let per_piece = ((room / sample.max(1)) as usize).clamp(1, dims.n.max(1));
        let [rows, cols, _] = dims.gemm(pass, groups, dims.n);
        // A large tile once there are half as many as the device has multiprocessors (an H200,
        // 132: 128×128 tiles measured 1.4× faster than 64×64 ones on 100 of them, c512→512
        // 3×3 7², and 256×64 1.2× faster on 784, c64→64 56²). Backward filter's ranges
        // multiply its tiles: the smallest tile is enough there.
        let workgroups = target.parallel_slots / 4096;
        let tile = match (forced_tile(), pass) {
            (Some(tile), _) => tile,
            (None, ConvPass::BackwardFilter) => tile_for(rows, cols, groups, usize::MAX),
            (None, _) => tile_for(rows, cols, groups, workgroups),
        };
        if pass != ConvPass::BackwardFilter {
            // (Ranges of the whole batch: one range, never accumulated.)
            let mut all = pieces(dims.n, per_piece, dims.n.max(1));
            for p in &mut all {
                p.accumulate = false;
            }
            return Ok(ConvPlan {
                dims,
                pieces: all,
                tile,
                per_split: dims.n,
                partials: 0,
            });
        }
        // Enough sample ranges that the product's tiles fill the device (each range's sum is
        // still at least a tile's worth of terms), and partials that fit one binding.
        let tiles = rows.div_ceil(tile[0]) * cols.div_ceil(tile[1]) * groups;
        let wanted = (target.parallel_slots / 256).div_ceil(tiles.max(1)).max(1);
        let depth = dims.oh * dims.ow;
        let mut per_split = dims.n.div_ceil(wanted).max(64usize.div_ceil(depth.max(1)));
        let most = (room / (weight * acc_bytes as u128).max(1)) as usize;
        if most == 0 {
            return Err(too_big("one partial product", weight));
        }
        per_split = per_split.max(dims.n.div_ceil(most)).min(dims.n).max(1);
        Ok(ConvPlan {
            dims,
            pieces: pieces(dims.n, per_piece, per_split),
            tile,
            per_split,
            partials: dims.n.div_ceil(per_split),
        })
    }
}

impl ConvPlan {
    /// Every launch of `pass`, in order: each piece, and for backward data each of its stride
    /// phases ([`phases`]); launches of no rows (an empty batch) left out.
    ///
    /// ```
    /// use strata_core::ir::{ConvGeometry, ConvPass};
    /// use strata_core::lower::conv_plan::{ConvDims, ConvPlan};
    /// use strata_core::target::Target;
    /// let g = ConvGeometry { stride: [2, 2], padding: [1, 1], dilation: [1, 1], groups: 1 };
    /// // dy [2, 8, 4, 4], w [8, 3, 3, 3] → dx [2, 3, 8, 8]: four phases, 2·4·4 rows each.
    /// let d = ConvDims::of(ConvPass::BackwardData, &[2, 8, 4, 4], &[8, 3, 3, 3], &[2, 3, 8, 8])?;
    /// let plan = ConvPlan::of(ConvPass::BackwardData, &g, d, &Target::cpu(4), 4, [4; 3])?;
    /// let launches = plan.launches(ConvPass::BackwardData, &g);
    /// assert_eq!(launches.len(), 4);
    /// let (piece, phase) = &launches[3];
    /// let words = plan.launch_words(ConvPass::BackwardData, &g, piece, phase.as_ref());
    /// assert_eq!((words[0], words[2]), (2 * 4 * 4, 8 * 2 * 2));
    /// assert_eq!(plan.divisors(phase.as_ref()), [4, 2, 16, 4]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn launches(
        &self,
        pass: ConvPass,
        g: &ConvGeometry,
    ) -> Vec<(ConvPiece, Option<ConvPhase>)> {
        let phases: Vec<Option<ConvPhase>> = match pass {
            ConvPass::BackwardData => phases(g, &self.dims).into_iter().map(Some).collect(),
            _ => vec![None],
        };
        self.pieces
            .iter()
            .flat_map(|p| phases.iter().map(move |ph| (*p, *ph)))
            .filter(|(p, ph)| self.launch_words(pass, g, p, ph.as_ref())[0] > 0)
            .collect()
    }

    /// Whether the kernels index in 32 bits, dividing by a multiply and a shift: every index
    /// of the plan fits ([`ConvDims::fits_32_bits`]) and `STRATA_CONV_INDEX=64` does not ask
    /// for the wide path (the tests run both).
    ///
    /// ```
    /// use strata_core::ir::{ConvGeometry, ConvPass};
    /// use strata_core::lower::conv_plan::{ConvDims, ConvPlan};
    /// use strata_core::target::Target;
    /// let g = ConvGeometry { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 };
    /// let d = ConvDims::of(ConvPass::Forward, &[2, 3, 8, 8], &[4, 3, 3, 3], &[2, 4, 8, 8])?;
    /// let plan = ConvPlan::of(ConvPass::Forward, &g, d, &Target::cpu(4), 4, [4; 3])?;
    /// assert_eq!(plan.narrow_indices(1), std::env::var("STRATA_CONV_INDEX").as_deref() != Ok("64"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn narrow_indices(&self, groups: usize) -> bool {
        self.dims.fits_32_bits(groups, self.partials)
            && std::env::var("STRATA_CONV_INDEX").as_deref() != Ok("64")
    }

    /// The sizes a launch's gathers divide a depth or a pixel by (words 26..34, each as a
    /// [`division_magic`]): all the taps (of a backward-data `phase`: its taps), the taps
    /// along the width, OH·OW and OW.
    pub fn divisors(&self, phase: Option<&ConvPhase>) -> [usize; 4] {
        let d = &self.dims;
        let [taps, across] = phase.map_or([d.kh * d.kw, d.kw], |p| p.tap_divisors());
        [taps, across, d.oh * d.ow, d.ow]
    }

    /// The first 19 launch words both renderers read for `piece` (of backward data: of its
    /// stride `phase`): its product's rows, columns and depth, its samples, C, H, W, O, kH,
    /// kW, OH, OW, the groups, then stride, padding and dilation (height, width).
    pub fn launch_words(
        &self,
        pass: ConvPass,
        g: &ConvGeometry,
        piece: &ConvPiece,
        phase: Option<&ConvPhase>,
    ) -> [usize; 19] {
        let (dims, groups) = (self.dims, g.groups.max(1));
        let [mut m, n, mut k] = dims.gemm(pass, groups, piece.samples);
        if let Some(p) = phase {
            m = piece.samples * p.extent[0] * p.extent[1];
            k = dims.o / groups * p.taps[0] * p.taps[1];
        }
        [
            m,
            n,
            k,
            piece.samples,
            dims.c,
            dims.h,
            dims.w,
            dims.o,
            dims.kh,
            dims.kw,
            dims.oh,
            dims.ow,
            groups,
            g.stride[0],
            g.stride[1],
            g.padding[0],
            g.padding[1],
            g.dilation[0],
            g.dilation[1],
        ]
    }
}

impl ConvDims {
    /// Whether every index a kernel computes for these sizes fits a 32-bit signed integer,
    /// with room for the tiles past the products' ends: each operand (and backward filter's
    /// partial products), plus a thousand samples' and weights' worth, twice over.
    ///
    /// ```
    /// use strata_core::lower::conv_plan::ConvDims;
    /// let d = ConvDims { n: 64, c: 64, h: 56, w: 56, o: 64, kh: 3, kw: 3, oh: 56, ow: 56 };
    /// assert!(d.fits_32_bits(1, 1));
    /// assert!(!ConvDims { n: 1 << 16, ..d }.fits_32_bits(1, 1));
    /// ```
    pub fn fits_32_bits(&self, groups: usize, partials: usize) -> bool {
        let [x, y] = self.per_sample().map(|e| e as u128);
        let w = (self.o * (self.c / groups.max(1)) * self.kh * self.kw) as u128;
        let n = self.n as u128;
        let largest = (x * n).max(y * n).max(w * partials.max(1) as u128);
        (largest + 1024 * (x + y + w)) * 2 < 1 << 31
    }
}

/// The multiplier `m` and shift `s` that divide any `n` below 2^31 by `d` (1 ≤ d < 2^31):
/// `n / d == (n · m) >> s` in 64-bit arithmetic — Granlund and Montgomery's round-up method,
/// `l = ⌈log2 d⌉`, `m = ⌈2^(31+l) / d⌉` (below 2^32), `s = 31 + l`; a kernel's division by a
/// size it reads at run time is then a multiply and a shift instead of a long sequence.
///
/// ```
/// use strata_core::lower::conv_plan::division_magic;
/// let [m, s] = division_magic(9);
/// assert_eq!((1_000_000u64 * m as u64) >> s, 1_000_000 / 9);
/// ```
pub fn division_magic(d: usize) -> [u32; 2] {
    let d = d.max(1) as u128;
    let l = 128 - (d - 1).leading_zeros();
    let m = (1u128 << (31 + l)).div_ceil(d);
    [m as u32, 31 + l]
}

/// One stride phase of backward data: the input pixels `(ph + s0·i, pw + s1·j)`, `i < rows`,
/// `j < cols`, and along each axis the taps `first + step·t`, `t < taps`, whose windows land on
/// them — those with `(ph + p0 − r·d0)` a multiple of `s0` — each reading output row
/// `i + base − t·advance`. Stride 1 is one phase of every tap.
///
/// ```
/// use strata_core::ir::ConvGeometry;
/// use strata_core::lower::conv_plan::{phases, ConvDims};
/// // 7×7, stride 2, padding 3 over 224²: four phases of 3×3, 3×4, 4×3 and 4×4 taps. Even
/// // pixels take the odd taps (1, 3, 5), the first reading output row i + 1.
/// let g = ConvGeometry { stride: [2, 2], padding: [3, 3], dilation: [1, 1], groups: 1 };
/// let d = ConvDims { n: 1, c: 3, h: 224, w: 224, o: 64, kh: 7, kw: 7, oh: 112, ow: 112 };
/// let p = phases(&g, &d);
/// assert_eq!(p.len(), 4);
/// assert_eq!((p[0].pixel, p[0].extent, p[0].taps), ([0, 0], [112, 112], [3, 3]));
/// assert_eq!((p[0].first, p[0].step, p[0].base, p[0].advance), ([1, 1], [2, 2], [1, 1], [1, 1]));
/// assert_eq!((p[3].pixel, p[3].taps, p[3].first, p[3].base), ([1, 1], [4, 4], [0, 0], [2, 2]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvPhase {
    /// The phase's first input pixel (height, width).
    pub pixel: [usize; 2],
    /// Its pixels along each axis.
    pub extent: [usize; 2],
    /// Its taps along each axis (0: none land, its pixels' gradient is 0).
    pub taps: [usize; 2],
    /// The first tap.
    pub first: [usize; 2],
    /// Between taps.
    pub step: [usize; 2],
    /// The output row (column) the first tap reads for pixel `i = 0`.
    pub base: [isize; 2],
    /// How far back each further tap reads.
    pub advance: [usize; 2],
}

impl ConvPhase {
    /// The 14 words both renderers read after the others: the first pixel, the extent, the
    /// taps, the first tap, the step, the base and the advance, each height then width.
    ///
    /// ```
    /// use strata_core::ir::ConvGeometry;
    /// use strata_core::lower::conv_plan::{phases, ConvDims};
    /// let g = ConvGeometry { stride: [2, 1], padding: [0, 1], dilation: [1, 1], groups: 1 };
    /// let d = ConvDims { n: 1, c: 1, h: 4, w: 3, o: 1, kh: 3, kw: 3, oh: 1, ow: 3 };
    /// // Odd rows take tap 1 (reading output row i + 0); every column all three taps.
    /// let w = phases(&g, &d)[1].words();
    /// assert_eq!(w, [1, 0, 2, 3, 1, 3, 1, 0, 2, 1, 0, 1, 1, 1]);
    /// ```
    pub fn words(&self) -> [i64; 14] {
        let u = |v: [usize; 2]| v.map(|x| x as i64);
        let [a, b, c, d, e, f, h] = [
            u(self.pixel),
            u(self.extent),
            u(self.taps),
            u(self.first),
            u(self.step),
            self.base.map(|x| x as i64),
            u(self.advance),
        ];
        [
            a[0], a[1], b[0], b[1], c[0], c[1], d[0], d[1], e[0], e[1], f[0], f[1], h[0], h[1],
        ]
    }

    /// The divisors a gather divides a depth by: all the phase's taps, then its taps along
    /// the width.
    ///
    /// ```
    /// use strata_core::ir::ConvGeometry;
    /// use strata_core::lower::conv_plan::{phases, ConvDims};
    /// let g = ConvGeometry { stride: [2, 2], padding: [3, 3], dilation: [1, 1], groups: 1 };
    /// let d = ConvDims { n: 1, c: 3, h: 224, w: 224, o: 64, kh: 7, kw: 7, oh: 112, ow: 112 };
    /// assert_eq!(phases(&g, &d)[1].tap_divisors(), [3 * 4, 4]);
    /// ```
    pub fn tap_divisors(&self) -> [usize; 2] {
        [self.taps[0] * self.taps[1], self.taps[1]]
    }
}

/// The stride phases of backward data over `dims` (see [`ConvPhase`]), height-major: one
/// phase at stride 1, `s0·s1` of them otherwise (fewer where the input is smaller than the
/// stride).
///
/// ```
/// use strata_core::ir::ConvGeometry;
/// use strata_core::lower::conv_plan::{phases, ConvDims};
/// let d = ConvDims { n: 1, c: 1, h: 5, w: 5, o: 1, kh: 3, kw: 3, oh: 5, ow: 5 };
/// let one = ConvGeometry { stride: [1, 1], padding: [1, 1], dilation: [1, 1], groups: 1 };
/// let all = phases(&one, &d);
/// assert_eq!((all.len(), all[0].taps, all[0].extent), (1, [3, 3], [5, 5]));
/// // Stride 2, dilation 2: the taps that land on a pixel are all or none of them.
/// let g = ConvGeometry { stride: [2, 2], padding: [0, 0], dilation: [2, 2], groups: 1 };
/// let taps: Vec<[usize; 2]> = phases(&g, &d).iter().map(|p| p.taps).collect();
/// assert_eq!(taps, [[3, 3], [3, 0], [0, 3], [0, 0]]);
/// ```
pub fn phases(g: &ConvGeometry, dims: &ConvDims) -> Vec<ConvPhase> {
    // Along one axis: (pixel, extent, taps, first, step, base, advance) of each phase.
    let axis = |a: usize,
                size: usize,
                k: usize|
     -> Vec<(usize, usize, usize, usize, usize, isize, usize)> {
        let (s, p, d) = (
            g.stride[a].max(1),
            g.padding[a] as isize,
            g.dilation[a].max(1),
        );
        // The taps that land on a pixel repeat every `step` (d·step is a multiple of s).
        let step = s / gcd(s, d);
        (0..s.min(size).max(1))
            .map(|ph| {
                let extent = size.saturating_sub(ph).div_ceil(s);
                let reach = |r: usize| ph as isize + p - (r * d) as isize;
                match (0..k.min(step)).find(|&r| reach(r).rem_euclid(s as isize) == 0) {
                    Some(r0) => (
                        ph,
                        extent,
                        (k - 1 - r0) / step + 1,
                        r0,
                        step,
                        reach(r0).div_euclid(s as isize),
                        step * d / s,
                    ),
                    None => (ph, extent, 0, 0, step, 0, 0),
                }
            })
            .collect()
    };
    let (rows, cols) = (axis(0, dims.h, dims.kh), axis(1, dims.w, dims.kw));
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    for r in &rows {
        for c in &cols {
            out.push(ConvPhase {
                pixel: [r.0, c.0],
                extent: [r.1, c.1],
                taps: [r.2, c.2],
                first: [r.3, c.3],
                step: [r.4, c.4],
                base: [r.5, c.5],
                advance: [r.6, c.6],
            });
        }
    }
    out
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The tile `STRATA_CONV_TILE` names (`128x128`: one of [`TILES`]), which every convolution
/// then takes: the tests run each tile on small shapes, whose own choice is the smallest.
fn forced_tile() -> Option<[usize; 2]> {
    let v = std::env::var("STRATA_CONV_TILE").ok()?;
    let (r, c) = v.split_once('x')?;
    let tile = [r.trim().parse().ok()?, c.trim().parse().ok()?];
    TILES.contains(&tile).then_some(tile)
}

/// `n` samples in pieces of at most `per_piece` that never straddle a range of `per_split`:
/// whole ranges together where a piece holds one, else each range in several pieces.
fn pieces(n: usize, per_piece: usize, per_split: usize) -> Vec<ConvPiece> {
    let mut out = Vec::new();
    let ranges = per_piece / per_split;
    let mut first = 0;
    while first < n {
        let (samples, splits) = if ranges > 0 {
            let samples = (ranges * per_split).min(n - first);
            (samples, samples.div_ceil(per_split))
        } else {
            let end = ((first / per_split + 1) * per_split).min(n);
            (per_piece.min(end - first), 1)
        };
        out.push(ConvPiece {
            first,
            samples,
            splits,
            accumulate: first % per_split != 0,
        });
        first += samples;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> ConvGeometry {
        ConvGeometry {
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        }
    }

    #[test]
    fn stride_phases_take_exactly_the_taps_that_land() {
        // Against the definition: pixel h takes tap r where (h + p - r·d) is a multiple of s,
        // reading output row (h + p - r·d) / s.
        for (s, p, d, k, h) in [
            (1, 1, 1, 3, 5),
            (2, 3, 1, 7, 9),
            (3, 0, 2, 3, 8),
            (2, 1, 2, 3, 6),
            (4, 2, 3, 5, 11),
        ] {
            let g = ConvGeometry {
                stride: [s, 1],
                padding: [p, 0],
                dilation: [d, 1],
                groups: 1,
            };
            let dims = ConvDims {
                n: 1,
                c: 1,
                h,
                w: 1,
                o: 1,
                kh: k,
                kw: 1,
                oh: 64,
                ow: 1,
            };
            let mut seen = 0;
            for ph in phases(&g, &dims) {
                for i in 0..ph.extent[0] {
                    let pixel = ph.pixel[0] + s * i;
                    let got: Vec<(usize, isize)> = (0..ph.taps[0])
                        .map(|t| {
                            let r = ph.first[0] + ph.step[0] * t;
                            (r, i as isize + ph.base[0] - (t * ph.advance[0]) as isize)
                        })
                        .collect();
                    let want: Vec<(usize, isize)> = (0..k)
                        .filter(|r| {
                            (pixel as isize + p as isize - (r * d) as isize).rem_euclid(s as isize)
                                == 0
                        })
                        .map(|r| {
                            (
                                r,
                                (pixel as isize + p as isize - (r * d) as isize)
                                    .div_euclid(s as isize),
                            )
                        })
                        .collect();
                    assert_eq!(got, want, "s {s} p {p} d {d} k {k} pixel {pixel}");
                    seen += 1;
                }
            }
            assert_eq!(seen, h, "every pixel in one phase");
        }
    }

    #[test]
    fn division_by_a_multiply_and_a_shift_is_exact_below_2_to_the_31() {
        let mut ns: Vec<u64> = (0..5000).collect();
        ns.extend((0..64).map(|k| (1u64 << 31) - 1 - k * 7919));
        for d in (1..3000).chain([65536, 65537, 3136, 12544, (1 << 30) + 3, (1 << 31) - 1]) {
            let [m, s] = division_magic(d);
            for &n in &ns {
                assert_eq!((n * m as u64) >> s, n / d as u64, "{n} / {d}");
            }
        }
    }

    #[test]
    fn pieces_fit_the_binding_and_cover_the_batch() {
        // x [10, 4, 8, 8] f32: 1 KiB a sample; a 4 KiB binding (less 256 of alignment) holds
        // three samples.
        let mut t = Target::cpu(1);
        t.binding_limit = Some(4096);
        t.offset_align = 256;
        let d = ConvDims::of(
            ConvPass::Forward,
            &[10, 4, 8, 8],
            &[4, 4, 3, 3],
            &[10, 4, 8, 8],
        )
        .unwrap();
        let plan = ConvPlan::of(ConvPass::Forward, &geometry(), d, &t, 4, [4; 3]).unwrap();
        let firsts: Vec<_> = plan.pieces.iter().map(|p| (p.first, p.samples)).collect();
        assert_eq!(firsts, [(0, 3), (3, 3), (6, 3), (9, 1)]);
        assert_eq!(plan.partials, 0);
        assert!(plan.pieces.iter().all(|p| p.splits == 1 && !p.accumulate));
        // One sample too big for the binding: an error that says so.
        t.binding_limit = Some(900);
        let e = ConvPlan::of(ConvPass::Forward, &geometry(), d, &t, 4, [4; 3]).unwrap_err();
        assert!(e.to_string().contains("one sample"), "{e}");
    }

    #[test]
    fn backward_filter_splits_its_sum_over_the_samples() {
        let mut t = Target::cpu(1);
        t.parallel_slots = 64 * 256;
        let d = ConvDims::of(
            ConvPass::BackwardFilter,
            &[32, 16, 8, 8],
            &[32, 16, 8, 8],
            &[16, 16, 3, 3],
        )
        .unwrap();
        // 16 rows × 144 columns: one wide tile (16 × 256); 64 workgroups wanted → a range a
        // sample (64 terms a range at least: one sample has 64).
        let plan = ConvPlan::of(ConvPass::BackwardFilter, &geometry(), d, &t, 4, [4; 3]).unwrap();
        assert_eq!(plan.tile, [16, 256]);
        assert_eq!((plan.per_split, plan.partials), (1, 32));
        let whole = ConvPiece {
            first: 0,
            samples: 32,
            splits: 32,
            accumulate: false,
        };
        assert_eq!(plan.pieces, [whole]);
        // A binding of 3 samples' 4 KiB (and the alignment) holds one weight-sized partial:
        // ranges of all 32 samples, each piece of 3 adding to the one partial after the first.
        t.binding_limit = Some(3 * 4096 + 256);
        t.offset_align = 256;
        let plan = ConvPlan::of(ConvPass::BackwardFilter, &geometry(), d, &t, 4, [4; 3]).unwrap();
        assert_eq!((plan.per_split, plan.partials), (32, 1));
        let spans: Vec<_> = plan.pieces.iter().map(|p| (p.first, p.samples)).collect();
        assert_eq!(spans.len(), 11);
        assert_eq!((spans[0], spans[10]), ((0, 3), (30, 2)));
        assert!(plan
            .pieces
            .iter()
            .all(|p| p.splits == 1 && p.accumulate == (p.first > 0)));
        // With a smaller weight, pieces of whole ranges: 1 KiB partials, 12 fit → ranges of 3
        // samples, one per piece.
        let d = ConvDims::of(
            ConvPass::BackwardFilter,
            &[32, 16, 8, 8],
            &[32, 4, 8, 8],
            &[4, 16, 2, 2],
        )
        .unwrap();
        let plan = ConvPlan::of(ConvPass::BackwardFilter, &geometry(), d, &t, 4, [4; 3]).unwrap();
        assert_eq!((plan.per_split, plan.partials), (3, 11));
        assert!(plan.pieces.iter().all(|p| p.splits == 1 && !p.accumulate));
    }
}
