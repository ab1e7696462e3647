//! 2-D tensors as heatmap images: values sampled down to at most 256 × 256 cells, coloured
//! with a viridis-like scale, and a colour bar beside them.

use super::image;
use crate::display::scalar_at;
use crate::error::{Error, Result};
use crate::index::SliceArg;
use crate::tensor::Tensor;

/// At most this many cells along each axis; larger tensors are sampled with a step.
const MAX_CELLS: usize = 256;
/// Cells are scaled up to roughly this many pixels along each axis...
const TARGET_PIXELS: usize = 256;
/// ...but no cell is wider or taller than this.
const MAX_CELL_PIXELS: usize = 32;
const BAR_GAP: usize = 6;
const BAR_WIDTH: usize = 12;
const NAN_RGB: [u8; 3] = [160, 160, 160];
const BACKGROUND: [u8; 3] = [255, 255, 255];

/// Viridis at 0, ¼, ½, ¾ and 1, interpolated linearly.
const SCALE: [[u8; 3]; 5] = [
    [68, 1, 84],
    [59, 82, 139],
    [33, 145, 140],
    [94, 201, 98],
    [253, 231, 37],
];

/// The colour of `t` in 0..=1.
fn colour(t: f64) -> [u8; 3] {
    let x = t.clamp(0.0, 1.0) * (SCALE.len() - 1) as f64;
    let i = (x.floor() as usize).min(SCALE.len() - 2);
    let f = x - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    let (a, b) = (SCALE[i], SCALE[i + 1]);
    [mix(a[0], b[0]), mix(a[1], b[1]), mix(a[2], b[2])]
}

/// A rendered heatmap: the PNG file and the value range its colour bar spans.
pub(crate) struct Heatmap {
    /// The map, a white gap and the colour bar in one image (for `heatmap_png` and Jupyter's
    /// `image/png`).
    pub png: Vec<u8>,
    /// The map alone and the bar alone: the HTML display lays them out with a transparent gap,
    /// so no white stripe shows in a dark theme.
    pub map_png: Vec<u8>,
    pub bar_png: Vec<u8>,
    /// The image's height in pixels (the colour bar's labels sit at its ends).
    pub height: usize,
    /// The smallest and largest finite values of the whole tensor, sampled or not (`None`
    /// when there are none).
    pub range: Option<(f64, f64)>,
    /// The sampling step along rows and columns (1 when every element is drawn).
    pub step: (usize, usize),
}

/// Renders a 2-D numeric tensor; NaN is grey, ±∞ the ends of the scale.
pub(crate) fn render(t: &Tensor) -> Result<Heatmap> {
    if t.ndim() != 2 || t.numel() == 0 || t.dtype() == crate::dtype::DType::Bool {
        return Err(Error::Invalid(format!(
            "a heatmap needs a non-empty 2-D numeric tensor, not shape {:?} of {}",
            t.shape(),
            t.dtype()
        )));
    }
    let step = (
        t.shape()[0].div_ceil(MAX_CELLS),
        t.shape()[1].div_ceil(MAX_CELLS),
    );
    let sampled = t.slice(vec![
        SliceArg::from(..).with_step(step.0 as isize)?,
        SliceArg::from(..).with_step(step.1 as isize)?,
    ])?;
    let (rows, cols) = (sampled.shape()[0], sampled.shape()[1]);
    let bytes = sampled.host_bytes()?;
    let values: Vec<f64> = (0..rows * cols)
        .map(|i| scalar_at(t.dtype(), &bytes, i).to_f64())
        .collect();
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let range = if step == (1, 1) {
        finite.fold(None, |r: Option<(f64, f64)>, v| match r {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
    } else {
        // Sampled: the bar spans the whole tensor, not only the drawn cells.
        finite_range(t)?
    };
    let position = |v: f64| match range {
        _ if v.is_nan() => None,
        _ if v == f64::INFINITY => Some(1.0),
        _ if v == f64::NEG_INFINITY => Some(0.0),
        Some((lo, hi)) if hi > lo => Some((v - lo) / (hi - lo)),
        _ => Some(0.5),
    };

    let cell_w = (TARGET_PIXELS / cols).clamp(1, MAX_CELL_PIXELS);
    let cell_h = (TARGET_PIXELS / rows).clamp(1, MAX_CELL_PIXELS);
    let (map_w, height) = (cols * cell_w, rows * cell_h);
    let width = map_w + BAR_GAP + BAR_WIDTH;
    let (mut rgb, mut map, mut bar) = (Vec::new(), Vec::new(), Vec::new());
    for y in 0..height {
        let row = &values[y / cell_h * cols..][..cols];
        let start = map.len();
        for x in 0..map_w {
            map.extend(position(row[x / cell_w]).map_or(NAN_RGB, colour));
        }
        rgb.extend_from_slice(&map[start..]);
        rgb.extend(BACKGROUND.repeat(BAR_GAP));
        // The bar runs from the largest value at the top to the smallest at the bottom.
        let top_down = 1.0 - y as f64 / (height - 1).max(1) as f64;
        let line = colour(top_down).repeat(BAR_WIDTH);
        rgb.extend_from_slice(&line);
        bar.extend(line);
    }
    Ok(Heatmap {
        png: image::encode_rgb(width, height, &rgb)?,
        map_png: image::encode_rgb(map_w, height, &map)?,
        bar_png: image::encode_rgb(BAR_WIDTH, height, &bar)?,
        height,
        range,
        step,
    })
}

/// The smallest and largest finite elements of `t`, reduced on its device.
fn finite_range(t: &Tensor) -> Result<Option<(f64, f64)>> {
    use crate::ops::Axes;
    let value = |r: Tensor| -> Result<f64> { r.to_dtype(crate::dtype::DType::F64)?.item::<f64>() };
    if !t.dtype().is_float() {
        let lo = value(t.min(Axes::All, false)?)?;
        return Ok(Some((lo, value(t.max(Axes::All, false)?)?)));
    }
    let finite = t.isfinite()?;
    if !finite.any(Axes::All, false)?.item::<bool>()? {
        return Ok(None);
    }
    let lo = Tensor::where_cond(&finite, t, f64::INFINITY)?.min(Axes::All, false)?;
    let hi = Tensor::where_cond(&finite, t, f64::NEG_INFINITY)?.max(Axes::All, false)?;
    Ok(Some((value(lo)?, value(hi)?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    #[test]
    fn scale_ends_are_viridis_ends() {
        assert_eq!(colour(0.0), SCALE[0]);
        assert_eq!(colour(1.0), SCALE[4]);
        assert_eq!(colour(0.5), SCALE[2]);
        assert_eq!(colour(-3.0), SCALE[0]);
    }

    #[test]
    fn large_tensors_are_sampled_and_range_ignores_nan() {
        let dev = Device::cpu();
        let t = Tensor::arange(0.0, 600.0 * 3.0, 1.0, DType::F32, &dev)
            .unwrap()
            .reshape([600, 3])
            .unwrap();
        t.slice(crate::s![0, 0]).unwrap().fill(f64::NAN).unwrap();
        let h = render(&t).unwrap();
        assert_eq!(h.step, (3, 1));
        // The whole tensor's range (the drawn rows end at 1793), NaN left out.
        assert_eq!(h.range, Some((1.0, 1799.0)));
        assert!(render(&Tensor::zeros([3], DType::F32, &dev).unwrap()).is_err());
    }
}
