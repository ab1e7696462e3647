//! A line plot of a series of numbers (a loss per step, say), for notebooks: axes with the
//! first and last step and the lowest and highest value, the line, and a title. Inline SVG
//! with attributes only, on a light card so it reads the same in a dark theme.

use super::html::escape;
use super::svg::Svg;
use std::fmt::Write;

const W: f64 = 480.0;
const H: f64 = 240.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 34.0;

/// `values` as a line over their index, titled `title`; non-finite values are left out.
/// With `log` the vertical axis is logarithmic (values ≤ 0 are left out then).
///
/// ```
/// let losses = [4.0, 2.0, 1.0, 0.5, 0.25];
/// let svg = strata_core::line_plot(&losses, "loss", true).to_string();
/// assert!(svg.starts_with("<svg") && svg.contains("loss") && svg.contains("<polyline"));
/// ```
pub fn line_plot(values: &[f64], title: &str, log: bool) -> Svg {
    let shown = |v: f64| v.is_finite() && (!log || v > 0.0);
    let y_of = |v: f64| if log { v.log10() } else { v };
    let points: Vec<(usize, f64)> = values
        .iter()
        .enumerate()
        .filter(|(_, &v)| shown(v))
        .map(|(i, &v)| (i, y_of(v)))
        .collect();
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         font-family=\"monospace\" font-size=\"11\"><rect width=\"{W}\" height=\"{H}\" \
         fill=\"#ffffff\" rx=\"6\"/><text x=\"{LEFT}\" y=\"18\" fill=\"#24292f\" \
         font-size=\"12\">{}</text>",
        escape(title)
    );
    let (x0, x1) = (LEFT, W - RIGHT);
    let (y0, y1) = (H - BOTTOM, TOP);
    let _ = write!(
        s,
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"#57606a\"/>\
         <line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"#57606a\"/>"
    );
    if points.is_empty() {
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"#57606a\">no values to plot</text></svg>",
            LEFT + 10.0,
            H / 2.0
        );
        return Svg(s);
    }
    let last = values.len().saturating_sub(1).max(1) as f64;
    let lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let px = |i: usize| x0 + (x1 - x0) * i as f64 / last;
    let py = |v: f64| y0 - (y0 - y1) * (v - lo) / span;
    let label = |v: f64| {
        let v = if log { 10f64.powf(v) } else { v };
        format!("{v:.3e}")
    };
    let path: Vec<String> = points
        .iter()
        .map(|&(i, v)| format!("{:.1},{:.1}", px(i), py(v)))
        .collect();
    let _ = write!(
        s,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#0969da\" stroke-width=\"2\"/>\
         <text x=\"{}\" y=\"{}\" fill=\"#57606a\" text-anchor=\"end\">{}</text>\
         <text x=\"{}\" y=\"{}\" fill=\"#57606a\" text-anchor=\"end\">{}</text>\
         <text x=\"{x0}\" y=\"{}\" fill=\"#57606a\">0</text>\
         <text x=\"{x1}\" y=\"{}\" fill=\"#57606a\" text-anchor=\"end\">{}</text>",
        path.join(" "),
        x0 - 6.0,
        y1 + 4.0,
        label(hi),
        x0 - 6.0,
        y0,
        label(lo),
        y0 + 16.0,
        y0 + 16.0,
        values.len().saturating_sub(1)
    );
    if log {
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"#57606a\">log scale</text>",
            x1 - 70.0,
            18
        );
    }
    s.push_str("</svg>");
    Svg(s)
}
