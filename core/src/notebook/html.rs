//! Tensors as HTML: a header line with the layout, then the values as a table (summarized
//! like the text display), then, for 2-D floats, the heatmap with its colour scale.

use super::heatmap::Heatmap;
use super::image::base64;
use crate::display::{element_strings, format_floats, summary, EDGE};
use crate::error::Result;
use crate::tensor::Tensor;
use std::fmt::Write;

const TABLE_STYLE: &str =
    "border-collapse:collapse;font-family:monospace;font-size:12px;margin:2px 0";
const INDEX_STYLE: &str = "color:#999;font-weight:normal;text-align:right;padding:1px 6px";
const CELL_STYLE: &str = "text-align:right;padding:1px 6px";

/// `s` with the characters HTML gives a meaning escaped.
pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One line naming everything about the layout: what a learner checks after every view.
pub(crate) fn header(t: &Tensor) -> String {
    let mut line = format!(
        "shape={:?} strides={:?} offset={} dtype={} device={} {}",
        t.shape(),
        t.strides(),
        t.offset(),
        t.dtype(),
        t.device().name(),
        if t.is_contiguous() {
            "contiguous"
        } else {
            "non-contiguous"
        }
    );
    if let Some(note) = t.autograd_note() {
        line.push(' ');
        line.push_str(&note);
    }
    line
}

/// The whole HTML display of `t`; `heatmap` is drawn under the values when given.
pub(crate) fn tensor(t: &Tensor, heatmap: Option<&Heatmap>) -> Result<String> {
    let mut out = format!(
        "<div class=\"strata-tensor\"><div style=\"font-family:monospace;margin-bottom:4px\">\
         <b>Tensor</b> {}</div>",
        escape(&header(t))
    );
    if super::layout_svg::layout_pictures_shown() {
        out.push_str(&format!(
            "<div style=\"margin-bottom:4px\">{}</div>",
            t.layout_svg()
        ));
    }
    out.push_str(&values(t)?);
    if let Some(map) = heatmap {
        out.push_str(&heatmap_html(map));
    }
    out.push_str("</div>");
    Ok(out)
}

/// The heatmap with its colour bar's labels at the bar's ends, in the table's number format.
fn heatmap_html(map: &Heatmap) -> String {
    let column = |top: &str, bottom: &str| {
        format!(
            "<div style=\"font-family:monospace;font-size:11px;display:flex;\
             flex-direction:column;justify-content:space-between;height:{}px\">\
             <span>{top}</span><span>{bottom}</span></div>",
            map.height
        )
    };
    let labels = match map.range {
        Some((lo, hi)) if lo == hi => {
            let v = &format_floats(&[lo])[0];
            format!("<div style=\"font-family:monospace;font-size:11px\">constant {v}</div>")
        }
        Some((lo, hi)) => {
            let s = format_floats(&[hi, lo]);
            column(&s[0], &s[1])
        }
        None => "<div style=\"font-family:monospace;font-size:11px\">no finite values</div>".into(),
    };
    let ordinal = |n: usize| match (n % 10, n % 100) {
        (1, r) if r != 11 => format!("{n}st"),
        (2, r) if r != 12 => format!("{n}nd"),
        (3, r) if r != 13 => format!("{n}rd"),
        _ => format!("{n}th"),
    };
    let mut every = Vec::new();
    if map.step.0 > 1 {
        every.push(format!("every {} row", ordinal(map.step.0)));
    }
    if map.step.1 > 1 {
        every.push(format!("every {} column", ordinal(map.step.1)));
    }
    let sampled = if every.is_empty() {
        String::new()
    } else {
        format!(
            "<div style=\"color:#999\">sampled: {} drawn; the bar spans every element</div>",
            every.join(" and ")
        )
    };
    format!(
        "<div style=\"display:flex;align-items:flex-start;gap:6px;margin-top:6px\">\
         <img alt=\"heatmap\" style=\"image-rendering:pixelated\" \
         src=\"data:image/png;base64,{}\"/><img alt=\"colour bar\" \
         src=\"data:image/png;base64,{}\"/>{labels}</div>{sampled}",
        base64(&map.map_png),
        base64(&map.bar_png)
    )
}

/// What an empty tensor shows instead of a table with no cells: which axes are empty.
fn empty_note(shape: &[usize]) -> String {
    let axes: Vec<String> = (0..shape.len())
        .filter(|&a| shape[a] == 0)
        .map(|a| a.to_string())
        .collect();
    let which = match axes.as_slice() {
        [a] => format!("axis {a} has size 0"),
        _ => format!("axes {} have size 0", axes.join(", ")),
    };
    format!("<div style=\"font-family:monospace;color:#999\">empty: 0 elements ({which})</div>")
}

/// The values as tables: a scalar, a 1-D row, a 2-D grid, or labelled 2-D slices.
fn values(t: &Tensor) -> Result<String> {
    if t.numel() == 0 {
        return Ok(empty_note(t.shape()));
    }
    let (shown, cut) = summary(t)?;
    let strs = element_strings(&shown)?;
    // The position in `t` of position `k` of the summary along `axis`.
    let original = |axis: usize, k: usize| {
        if cut[axis] && k >= EDGE {
            t.shape()[axis] - 2 * EDGE + k
        } else {
            k
        }
    };
    let mut out = String::new();
    let nd = shown.ndim();
    if nd == 0 {
        let _ = write!(
            out,
            "<table style=\"{TABLE_STYLE}\"><tr><td style=\"{CELL_STYLE}\">{}</td></tr></table>",
            escape(&strs[0])
        );
        return Ok(out);
    }
    let grid = Grid {
        strs: &strs,
        rows: (nd >= 2).then(|| (shown.shape()[nd - 2], cut[nd - 2])),
        cols: (shown.shape()[nd - 1], cut[nd - 1]),
        row_index: &|k| original(nd - 2, k),
        col_index: &|k| original(nd - 1, k),
    };
    if nd <= 2 {
        grid.write(&mut out, 0);
        return Ok(out);
    }
    let lead = &shown.shape()[..nd - 2];
    let per_slice = shown.shape()[nd - 2] * shown.shape()[nd - 1];
    let mut idx = vec![0usize; lead.len()];
    for slice in 0..lead.iter().product::<usize>() {
        let mut rest = slice;
        for a in (0..lead.len()).rev() {
            idx[a] = rest % lead[a];
            rest /= lead[a];
        }
        // A summarized leading axis skips from its first EDGE slices to its last.
        let skipped = (0..lead.len())
            .any(|a| cut[a] && idx[a] == EDGE && idx[a + 1..].iter().all(|&i| i == 0));
        if skipped {
            out.push_str("<div style=\"font-family:monospace\">⋮</div>");
        }
        let label: Vec<String> = idx
            .iter()
            .enumerate()
            .map(|(a, &k)| original(a, k).to_string())
            .chain([":".into(), ":".into()])
            .collect();
        let _ = write!(
            out,
            "<div style=\"font-family:monospace;color:#666\">[{}]</div>",
            label.join(", ")
        );
        grid.write(&mut out, slice * per_slice);
    }
    Ok(out)
}

/// One 2-D (or 1-D) table with index headers and `…` where an axis was summarized.
struct Grid<'a> {
    strs: &'a [String],
    /// Rows shown and whether they were summarized; `None` for a 1-D tensor.
    rows: Option<(usize, bool)>,
    cols: (usize, bool),
    row_index: &'a dyn Fn(usize) -> usize,
    col_index: &'a dyn Fn(usize) -> usize,
}

impl Grid<'_> {
    fn write(&self, out: &mut String, first: usize) {
        let (ncols, col_cut) = self.cols;
        let _ = write!(out, "<table style=\"{TABLE_STYLE}\"><tr>");
        if self.rows.is_some() {
            out.push_str("<th></th>");
        }
        for c in 0..ncols {
            if col_cut && c == EDGE {
                let _ = write!(out, "<th style=\"{INDEX_STYLE}\">…</th>");
            }
            let _ = write!(
                out,
                "<th style=\"{INDEX_STYLE}\">{}</th>",
                (self.col_index)(c)
            );
        }
        out.push_str("</tr>");
        let (nrows, row_cut) = self.rows.unwrap_or((1, false));
        for r in 0..nrows {
            if row_cut && r == EDGE {
                let span = ncols + usize::from(col_cut) + 1;
                let _ = write!(
                    out,
                    "<tr><th style=\"{INDEX_STYLE}\">⋮</th><td colspan=\"{}\"></td></tr>",
                    span - 1
                );
            }
            out.push_str("<tr>");
            if self.rows.is_some() {
                let _ = write!(
                    out,
                    "<th style=\"{INDEX_STYLE}\">{}</th>",
                    (self.row_index)(r)
                );
            }
            for c in 0..ncols {
                if col_cut && c == EDGE {
                    let _ = write!(out, "<td style=\"{CELL_STYLE}\">…</td>");
                }
                let _ = write!(
                    out,
                    "<td style=\"{CELL_STYLE}\">{}</td>",
                    escape(&self.strs[first + r * ncols + c])
                );
            }
            out.push_str("</tr>");
        }
        out.push_str("</table>");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{s, DType, Device};

    fn cells(html: &str) -> Vec<&str> {
        html.split("<td style=\"text-align:right;padding:1px 6px\">")
            .skip(1)
            .map(|c| c.split('<').next().unwrap_or(""))
            .collect()
    }

    #[test]
    fn header_names_layout_of_a_view() {
        let t = Tensor::arange(0, 12, 1, DType::I32, &Device::cpu())
            .unwrap()
            .reshape([3, 4])
            .unwrap();
        let v = t.slice(s![1.., ..;-2]).unwrap();
        assert_eq!(
            header(&v),
            "shape=[2, 2] strides=[4, -2] offset=7 dtype=i32 device=cpu non-contiguous"
        );
        let html = tensor(&v, None).unwrap();
        assert_eq!(cells(&html), ["7", "5", "11", "9"]);
    }

    #[test]
    fn summarized_axes_keep_original_indices() {
        let t = Tensor::arange(0, 2000, 1, DType::I32, &Device::cpu()).unwrap();
        let html = tensor(&t, None).unwrap();
        assert_eq!(cells(&html), ["0", "1", "2", "…", "1997", "1998", "1999"]);
        assert!(html.contains(">1999</th>"));
    }

    #[test]
    fn higher_ranks_are_labelled_slices_and_scalars_one_cell() {
        let dev = Device::cpu();
        let t = Tensor::arange(0, 8, 1, DType::U8, &dev)
            .unwrap()
            .reshape([2, 2, 2])
            .unwrap();
        let html = tensor(&t, None).unwrap();
        assert!(html.contains("[1, :, :]"), "{html}");
        assert_eq!(cells(&html).len(), 8);
        let s = Tensor::full([0usize; 0], 2.5, DType::F64, &dev).unwrap();
        assert_eq!(cells(&tensor(&s, None).unwrap()), ["2.5000"]);
    }

    #[test]
    fn the_colour_bar_is_labelled_at_its_ends_like_the_table() {
        let dev = Device::cpu();
        let t = Tensor::linspace(0.0, 11.0, 12, DType::F32, &dev)
            .unwrap()
            .reshape([3, 4])
            .unwrap();
        let html = heatmap_html(&super::super::heatmap::render(&t).unwrap());
        // Whole values print as the table prints them ("11." rather than "1.1000e1").
        let top = html.find("<span>11.</span>").unwrap();
        let bottom = html.find("<span>0.</span>").unwrap();
        assert!(
            top < bottom && html.contains("justify-content:space-between"),
            "{html}"
        );
        assert!(!html.contains("sampled"), "{html}");
        // Map and bar are separate images: the gap between them is the page's, not white.
        assert_eq!(html.matches("data:image/png;base64,").count(), 2, "{html}");
        let c = Tensor::full([2, 2], 3.0, DType::F32, &dev).unwrap();
        let html = heatmap_html(&super::super::heatmap::render(&c).unwrap());
        assert!(html.contains("constant 3."), "{html}");
        let tall = Tensor::zeros([600, 3], DType::F32, &dev).unwrap();
        let html = heatmap_html(&super::super::heatmap::render(&tall).unwrap());
        assert!(html.contains("sampled: every 3rd row drawn"), "{html}");
    }

    #[test]
    fn empty_tensors_render_headers_and_no_cells() {
        let dev = Device::cpu();
        for shape in [vec![0], vec![0, 3], vec![3, 0], vec![2, 0, 4]] {
            let t = Tensor::zeros(shape.clone(), DType::F32, &dev).unwrap();
            let html = t.to_html().unwrap();
            assert!(html.contains(&format!("shape={shape:?}")), "{html}");
            assert!(cells(&html).is_empty(), "{html}");
            assert!(html.contains("empty: 0 elements (ax"), "{html}");
        }
        let two = Tensor::zeros([0, 2, 0], DType::F32, &dev).unwrap();
        assert!(two.to_html().unwrap().contains("(axes 0, 2 have size 0)"));
        let nan = Tensor::full([2, 2], f64::NAN, DType::F32, &dev).unwrap();
        assert!(nan.to_html().unwrap().contains("no finite values"));
    }
}
