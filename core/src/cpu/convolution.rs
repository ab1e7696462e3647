//! The CPU `Convolution` kernel: the three passes as direct loops over every output element and
//! its terms, in f64 (so the reference is as exact as the dtype allows), rounded once into the
//! output. Plain and obviously right; output planes split across threads.

use super::strided::{load_f64, store_f64, threads};
use crate::backend::{KernelArgs, Operand};
use crate::error::{Error, Result};
use crate::ir::{ConvGeometry, ConvPass};
use crate::lower::conv_plan::ConvDims;

/// A contiguous operand's values as f64, with its four sizes.
fn load(op: &Operand) -> Result<(Vec<f64>, [usize; 4])> {
    let [a, b, c, d] = *op.layout.shape() else {
        return Err(Error::Backend(format!(
            "internal error: a convolution operand of shape {:?} (4-D expected)",
            op.layout.shape()
        )));
    };
    Ok((load_f64(op)?, [a, b, c, d]))
}

/// The input position a window tap reads, or `None` in the padding.
fn tap(out: usize, k: usize, axis: usize, g: &ConvGeometry, len: usize) -> Option<usize> {
    let p = (out * g.stride[axis] + k * g.dilation[axis]).checked_sub(g.padding[axis])?;
    (p < len).then_some(p)
}

/// Executes a `Convolution` kernel over contiguous operands (`[x, w]`, `[dy, w]` or `[x, dy]`).
pub(crate) fn run(pass: ConvPass, g: &ConvGeometry, args: &KernelArgs) -> Result<()> {
    let (Some(out), [a, b]) = (args.outputs.first(), args.inputs.as_slice()) else {
        return Err(Error::Backend(
            "internal error: a convolution takes two inputs and one output".into(),
        ));
    };
    let (va, sa) = load(a)?;
    let (vb, sb) = load(b)?;
    let ConvDims {
        n,
        c,
        h,
        w,
        o,
        kh,
        kw,
        oh,
        ow,
    } = ConvDims::of(pass, &sa, &sb, out.layout.shape())?;
    let groups = g.groups.max(1);
    let (cg, og) = (c / groups, o / groups);
    let x_at = |ni: usize, ci: usize, hi: usize, wi: usize| ((ni * c + ci) * h + hi) * w + wi;
    let y_at = |ni: usize, oi: usize, p: usize, q: usize| ((ni * o + oi) * oh + p) * ow + q;
    let w_at = |oi: usize, cj: usize, i: usize, j: usize| ((oi * cg + cj) * kh + i) * kw + j;
    // One output plane per job: (n, channel) of y or dx, (o, c/g) of dw.
    let (planes, plane_len) = match pass {
        ConvPass::Forward => (n * o, oh * ow),
        ConvPass::BackwardData => (n * c, h * w),
        ConvPass::BackwardFilter => (o * cg, kh * kw),
    };
    let plane = |job: usize| -> Vec<f64> {
        let mut vals = vec![0.0; plane_len];
        match pass {
            ConvPass::Forward => {
                let (ni, oi) = (job / o, job % o);
                let grp = oi / og.max(1);
                for (e, v) in vals.iter_mut().enumerate() {
                    let (p, q) = (e / ow, e % ow);
                    for cj in 0..cg {
                        for i in 0..kh {
                            let Some(hi) = tap(p, i, 0, g, h) else {
                                continue;
                            };
                            for j in 0..kw {
                                let Some(wi) = tap(q, j, 1, g, w) else {
                                    continue;
                                };
                                *v += va[x_at(ni, grp * cg + cj, hi, wi)] * vb[w_at(oi, cj, i, j)];
                            }
                        }
                    }
                }
            }
            ConvPass::BackwardData => {
                // dx[n, ci, hi, wi] = Σ dy[n, oi, p, q] · w[oi, cj, i, j] over the taps that
                // read (hi, wi).
                let (ni, ci) = (job / c, job % c);
                let (grp, cj) = (ci / cg.max(1), ci % cg.max(1));
                for oi in grp * og..(grp + 1) * og {
                    for p in 0..oh {
                        for i in 0..kh {
                            let Some(hi) = tap(p, i, 0, g, h) else {
                                continue;
                            };
                            for q in 0..ow {
                                let d = va[y_at(ni, oi, p, q)];
                                for j in 0..kw {
                                    let Some(wi) = tap(q, j, 1, g, w) else {
                                        continue;
                                    };
                                    vals[hi * w + wi] += d * vb[w_at(oi, cj, i, j)];
                                }
                            }
                        }
                    }
                }
            }
            ConvPass::BackwardFilter => {
                // dw[oi, cj, i, j] = Σ x[n, grp·cg + cj, tap] · dy[n, oi, p, q].
                let (oi, cj) = (job / cg.max(1), job % cg.max(1));
                let ci = (oi / og.max(1)) * cg + cj;
                for (e, v) in vals.iter_mut().enumerate() {
                    let (i, j) = (e / kw, e % kw);
                    for ni in 0..n {
                        for p in 0..oh {
                            let Some(hi) = tap(p, i, 0, g, h) else {
                                continue;
                            };
                            for q in 0..ow {
                                let Some(wi) = tap(q, j, 1, g, w) else {
                                    continue;
                                };
                                *v += va[x_at(ni, ci, hi, wi)] * vb[y_at(ni, oi, p, q)];
                            }
                        }
                    }
                }
            }
        }
        vals
    };
    // Small work on the calling thread (starting threads costs more than it).
    let macs = n * o * oh * ow * cg * kh * kw;
    let workers = if macs < super::strided::PARALLEL_MIN {
        1
    } else {
        threads()
    };
    let per = planes.div_ceil(workers).max(1);
    if per >= planes {
        let vals: Vec<f64> = (0..planes).flat_map(plane).collect();
        return store_f64(vals, out);
    }
    let parts: Vec<Vec<f64>> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..planes)
            .step_by(per)
            .map(|p0| {
                let plane = &plane;
                s.spawn(move || {
                    (p0..(p0 + per).min(planes))
                        .flat_map(plane)
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_default())
            .collect()
    });
    store_f64(parts.concat(), out)
}
