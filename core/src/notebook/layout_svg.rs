//! Pictures of a view over its storage: the storage as rows of cells, the view's elements
//! highlighted and labelled with their index, the offset marked and each axis's stride drawn
//! as an arrow from the first element to the next along that axis. A cell that several
//! elements share (a stride-0 broadcast axis) is drawn once, in another colour, with how many
//! elements read it. Inline SVG with attributes only (notebook viewers strip `<style>`), on a
//! light card so it reads the same in a dark theme.

use super::svg::Svg;
use crate::tensor::Tensor;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Storage cells per row of the picture.
const PER_ROW: usize = 16;
/// Storage cells drawn at most; past this the picture says how many it left out.
const MAX_CELLS: usize = 256;
/// View elements placed at most (a picture is for small views).
const MAX_ELEMENTS: usize = 1 << 16;
const CELL_W: usize = 40;
const CELL_H: usize = 30;
const LEFT: usize = 12;
/// Room above the cells: the caption and the offset marker.
const TOP: usize = 50;
/// Room under each row of cells: the storage index and the offset marker.
const ROW_GAP: usize = 30;

/// Whether the notebook display of a tensor includes its layout picture.
static SHOW_IN_DISPLAY: AtomicBool = AtomicBool::new(false);

/// Turns the layout picture in every tensor's notebook display on or off (off at start).
///
/// ```
/// strata_core::show_layout_pictures(true);
/// strata_core::show_layout_pictures(false);
/// ```
pub fn show_layout_pictures(on: bool) {
    SHOW_IN_DISPLAY.store(on, Ordering::Relaxed);
}

/// Whether [`show_layout_pictures`] is on.
pub(crate) fn layout_pictures_shown() -> bool {
    SHOW_IN_DISPLAY.load(Ordering::Relaxed)
}

impl Tensor {
    /// A picture of this view over its storage (see the module notes), as SVG: the storage's cells,
    /// the view's elements highlighted with their index (`1,2`), the offset marked, each
    /// axis's stride drawn as an arrow (backwards for a negative stride, a loop for a
    /// broadcast axis), and cells shared by several elements in orange with their count. The
    /// storage is drawn whole up to 64 elements, else around what the view reaches, at most
    /// 256 cells. It reads only the layout: no values, no synchronization.
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let t = Tensor::arange(0, 12, 1, DType::I32, &Device::cpu())?.reshape([3, 4])?;
    /// let svg = t.slice(s![1.., ..;-2])?.layout_svg().to_string();
    /// assert!(svg.contains("offset 7") && svg.contains("axis 1: stride -2"));
    /// assert_eq!(svg.matches("class=\"cell view\"").count(), 4);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn layout_svg(&self) -> Svg {
        Svg(render(self))
    }
}

/// The storage positions of the view's elements (row-major), at most `MAX_ELEMENTS`.
fn positions(t: &Tensor) -> Vec<(usize, Vec<usize>)> {
    let (shape, strides) = (t.shape(), t.strides());
    let n = t.numel().min(MAX_ELEMENTS);
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..n {
        let at = index
            .iter()
            .zip(strides)
            .fold(t.offset() as isize, |acc, (&i, &s)| acc + i as isize * s);
        out.push((at.max(0) as usize, index.clone()));
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

fn render(t: &Tensor) -> String {
    let storage = t.storage_bytes() / t.itemsize().max(1);
    let placed = positions(t);
    let reach = placed.iter().map(|p| p.0);
    let (min_at, max_at) = (
        reach.clone().min().unwrap_or(t.offset()),
        reach.max().unwrap_or(t.offset()),
    );
    // The cells drawn: the whole storage when small, else the reached span with a little
    // context, at most MAX_CELLS.
    let (lo, mut hi) = if storage <= 64 {
        (0, storage.max(max_at + 1))
    } else {
        (
            min_at.saturating_sub(2),
            (max_at + 3).min(storage.max(max_at + 1)),
        )
    };
    let cut = hi - lo > MAX_CELLS;
    hi = hi.min(lo + MAX_CELLS);
    let cells = hi - lo;
    let rows = cells.div_ceil(PER_ROW).max(1);
    // What each drawn cell holds: the first element's index and how many elements read it.
    let mut holders: Vec<(Option<&[usize]>, usize)> = vec![(None, 0); cells];
    for (at, index) in &placed {
        if (lo..hi).contains(at) {
            let h = &mut holders[at - lo];
            if h.0.is_none() {
                h.0 = Some(index);
            }
            h.1 += 1;
        }
    }
    let centre = |s: usize| -> (usize, usize) {
        let k = s - lo;
        (
            LEFT + (k % PER_ROW) * CELL_W + CELL_W / 2,
            TOP + (k / PER_ROW) * (CELL_H + ROW_GAP) + CELL_H / 2,
        )
    };
    let axes: Vec<usize> = (0..t.ndim()).filter(|&d| t.shape()[d] > 1).collect();
    let legend_top = TOP + rows * (CELL_H + ROW_GAP) - ROW_GAP + 30;
    let legend: Vec<String> = axes
        .iter()
        .map(|&d| {
            let stride = t.strides()[d];
            let what = match stride {
                0 => "broadcast: every index reads the same cells (loop)".to_string(),
                s if s < 0 => format!("{} cells back per step (arrow)", -s),
                s => format!("{s} cells on per step (arrow)"),
            };
            format!("axis {d}: stride {stride}, size {} — {what}", t.shape()[d])
        })
        .collect();
    let caption = format!(
        "storage: {storage} × {} ({}); view shape {:?} strides {:?}",
        t.dtype(),
        if cut || lo > 0 || hi < storage {
            format!("cells {lo}..{hi} drawn")
        } else {
            "all cells drawn".to_string()
        },
        t.shape(),
        t.strides()
    );
    // Wide enough for the cells and the longest line of text (monospace 11 px: ~6.7 px a
    // character).
    let longest = legend
        .iter()
        .map(|l| l.chars().count())
        .chain([caption.chars().count(), 60])
        .max()
        .unwrap_or(60);
    let width = (LEFT * 2 + PER_ROW.min(cells.max(1)) * CELL_W).max(LEFT * 2 + longest * 27 / 4);
    let height = legend_top + 16 * (axes.len() + 2) + 4;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"monospace\" font-size=\"11\">"
    );
    let _ = write!(
        s,
        "<defs><marker id=\"strata-arrow\" viewBox=\"0 0 8 8\" refX=\"7\" refY=\"4\" \
         markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L8,4 L0,8 z\" \
         fill=\"#7b2d8b\"/></marker></defs>"
    );
    let _ = write!(
        s,
        "<rect x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\" rx=\"6\" fill=\"#fafafa\" \
         stroke=\"#cccccc\"/>"
    );
    let _ = write!(
        s,
        "<text x=\"{LEFT}\" y=\"16\" fill=\"#222222\">{caption}</text>"
    );
    for (k, (index, count)) in holders.iter().enumerate() {
        let at = lo + k;
        let (cx, cy) = centre(at);
        let (x, y) = (cx - CELL_W / 2, cy - CELL_H / 2);
        let (class, fill) = match count {
            0 => ("cell", "#e3e3e3"),
            1 => ("cell view", "#9cc8f0"),
            _ => ("cell view shared", "#f5c07a"),
        };
        let _ = write!(
            s,
            "<rect class=\"{class}\" x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"{CELL_H}\" \
             fill=\"{fill}\" stroke=\"#777777\" stroke-width=\"0.6\"/>",
            CELL_W - 2
        );
        if let Some(index) = index {
            let label = index
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let label = if *count > 1 {
                format!("{label} ×{count}")
            } else {
                label
            };
            let size = if label.len() > 6 { 8 } else { 10 };
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"{size}\" \
                 fill=\"#111111\">{label}</text>",
                cx - 1,
                cy + 4
            );
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"8\" \
             fill=\"#777777\">{at}</text>",
            cx - 1,
            cy + CELL_H / 2 + 9
        );
    }
    // The offset: a marker under the first element's cell, below its storage index.
    if (lo..hi).contains(&t.offset()) {
        let (cx, cy) = centre(t.offset());
        let below = cy + CELL_H / 2 + 12;
        let _ = write!(
            s,
            "<path d=\"M{},{} L{},{} L{},{} z\" fill=\"#c0392b\"/>\
             <text x=\"{}\" y=\"{}\" fill=\"#c0392b\">offset {}</text>",
            cx - 5,
            below + 8,
            cx + 5,
            below + 8,
            cx,
            below,
            cx + 8,
            below + 9,
            t.offset()
        );
    }
    // Strides: from the first element to the next along each axis.
    for (n, &d) in axes.iter().enumerate() {
        let stride = t.strides()[d];
        let from = t.offset();
        let to = from as isize + stride;
        let lane = 4 + 3 * n as isize;
        if stride == 0 {
            if (lo..hi).contains(&from) {
                let (cx, cy) = centre(from);
                let r = 6 + n * 2;
                let _ = write!(
                    s,
                    "<circle class=\"stride\" cx=\"{cx}\" cy=\"{}\" r=\"{r}\" fill=\"none\" \
                     stroke=\"#7b2d8b\" stroke-width=\"1.2\"/>",
                    cy + CELL_H / 2 - 2
                );
            }
        } else if to >= lo as isize && (to as usize) < hi && (lo..hi).contains(&from) {
            let ((x0, y0), (x1, y1)) = (centre(from), centre(to as usize));
            // An arc above the cells (below for a second row), bowed per axis.
            let bow = (CELL_H as isize / 2 + lane * 2) as usize;
            let (y0, y1) = (y0 - CELL_H / 2 + 2, y1 - CELL_H / 2 + 2);
            let mx = (x0 + x1) / 2;
            let my = y0.min(y1).saturating_sub(bow.min(y0.min(y1)));
            let _ = write!(
                s,
                "<path class=\"stride\" d=\"M{x0},{y0} Q{mx},{my} {x1},{y1}\" fill=\"none\" \
                 stroke=\"#7b2d8b\" stroke-width=\"1.2\" marker-end=\"url(#strata-arrow)\"/>\
                 <text x=\"{mx}\" y=\"{}\" text-anchor=\"middle\" font-size=\"9\" \
                 fill=\"#7b2d8b\">axis {d}</text>",
                (y0.min(y1) + my) / 2 - 1
            );
        }
        let _ = write!(
            s,
            "<text x=\"{LEFT}\" y=\"{}\" fill=\"#222222\">{}</text>",
            legend_top + 12 + 16 * n,
            legend[n]
        );
    }
    let note_y = legend_top + 12 + 16 * axes.len();
    let shared = holders.iter().any(|h| h.1 > 1);
    let single = holders.iter().any(|h| h.1 == 1);
    let _ = write!(
        s,
        "<text x=\"{LEFT}\" y=\"{note_y}\" fill=\"#555555\">{}{}{}</text>",
        if single {
            "blue: an element of the view (its index)"
        } else {
            ""
        },
        match (single, shared) {
            (true, true) => "; orange: a cell several elements read (×count)",
            (false, true) => "orange: a cell several elements read (×count)",
            _ => "",
        },
        if t.numel() > MAX_ELEMENTS {
            format!("; the first {MAX_ELEMENTS} elements placed")
        } else {
            String::new()
        }
    );
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use crate::{s, DType, Device, Tensor};

    fn svg(t: &Tensor) -> String {
        t.layout_svg().to_string()
    }

    #[test]
    fn cells_elements_and_shared_cells_are_counted() {
        let dev = Device::cpu();
        let t = Tensor::arange(0, 6, 1, DType::F32, &dev).unwrap();
        let m = t.reshape([2, 3]).unwrap();
        let s = svg(&m);
        assert_eq!(s.matches("<rect class=\"cell").count(), 6);
        assert_eq!(s.matches("class=\"cell view\"").count(), 6);
        assert!(s.contains(">1,2</text>"), "{s}");
        // A transpose reaches the same cells, with the strides swapped.
        let tr = svg(&m.t().unwrap());
        assert!(tr.contains("axis 0: stride 1") && tr.contains("axis 1: stride 3"));
        assert!(tr.contains(">2,1</text>"));
        // A broadcast row: three cells read twice each, a loop for the stride-0 axis.
        let b = svg(&t.slice(s![..3]).unwrap().broadcast_to([2, 3]).unwrap());
        assert_eq!(b.matches("class=\"cell view shared\"").count(), 3);
        assert!(b.contains("×2") && b.contains("<circle class=\"stride\""));
        assert!(b.contains("axis 0: stride 0"));
    }

    #[test]
    fn offsets_negative_strides_and_large_storages() {
        let dev = Device::cpu();
        let t = Tensor::arange(0, 10, 1, DType::I64, &dev).unwrap();
        let flipped = svg(&t.slice(s![7..2;-2]).unwrap());
        assert!(flipped.contains("offset 7") && flipped.contains("stride -2"));
        assert_eq!(flipped.matches("class=\"cell view\"").count(), 3);
        // 10,000 elements: only the reached span is drawn, capped at 256 cells.
        let big = Tensor::zeros([10_000], DType::U8, &dev).unwrap();
        let part = svg(&big.slice(s![5000..5010]).unwrap());
        assert!(part.contains("cells 4998..5012 drawn"), "{part}");
        let whole = svg(&big);
        assert_eq!(whole.matches("<rect class=\"cell").count(), 256);
        // Every tag closes: no text nodes with markup characters.
        for doc in [&flipped, &part] {
            assert_eq!(doc.matches("<svg").count(), 1);
            assert!(doc.ends_with("</svg>"));
            assert_eq!(doc.matches("<text").count(), doc.matches("</text>").count());
        }
    }
}
