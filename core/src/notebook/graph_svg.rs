//! A picture of the backward graph behind a tensor: its op nodes (name, output shape, what
//! each saved, or that it was freed by a backward pass) in rows by distance from the tensor,
//! the leaves at the ends (shape, and whether a gradient has reached them), an arrow from each
//! node to each input its gradient flows to, and the ops one fused kernel computed in one
//! colour (a legend names them). Inline SVG with attributes only, on a light card so it reads
//! the same in a dark theme.

use super::html::escape;
use super::svg::Svg;
use crate::autograd::graph::{AutogradMeta, Edge, Node};
use crate::dtype::DType;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

/// Nodes drawn at most; a larger graph says how many it left out.
const MAX_ITEMS: usize = 120;
const BOX_H: usize = 52;
const ROW_GAP: usize = 38;
const COL_GAP: usize = 16;
const MARGIN: usize = 14;
const TOP: usize = 34;
/// Characters → pixels at the picture's 12 px monospace font.
const CHAR_W: usize = 7;
/// Fills for the fused kernels, in order (pale, so the text reads on each).
const KERNEL_FILLS: [&str; 6] = [
    "#cfe8ff", "#ffe3b8", "#d6f5d6", "#f5d6f0", "#fff5b3", "#dcd6ff",
];

/// One box of the picture.
enum Item {
    Node(Arc<Node>),
    Leaf(Arc<AutogradMeta>),
}

impl Item {
    fn key(&self) -> usize {
        match self {
            Item::Node(n) => Arc::as_ptr(n) as *const u8 as usize,
            Item::Leaf(m) => Arc::as_ptr(m) as *const u8 as usize,
        }
    }
}

fn shape_text(dtype: DType, shape: &[usize]) -> String {
    format!("{dtype} {shape:?}")
}

/// The lines of text in an item's box.
fn lines(item: &Item) -> Vec<String> {
    match item {
        Item::Node(n) => {
            let mut v = vec![n.name.to_string(), shape_text(n.dtype, &n.shape)];
            if !n.saved.is_empty() {
                if n.is_retained() {
                    let saved: Vec<String> =
                        n.saved.iter().map(|(s, d)| format!("{d}{s:?}")).collect();
                    v.push(format!("saved {}", saved.join(", ")));
                } else {
                    v.push("saved: freed by backward".into());
                }
            }
            v
        }
        Item::Leaf(m) => vec![
            "leaf".into(),
            shape_text(m.dtype, &m.shape),
            if m.grad().is_some() {
                "grad accumulated".into()
            } else {
                "no grad yet".into()
            },
        ],
    }
}

/// The graph behind `t`, laid out in rows.
struct Layered {
    /// Item indices by row (row 0: `t`'s own node or leaf).
    rows: Vec<Vec<usize>>,
    items: Vec<Item>,
    /// Per item, the indices of its inputs' items.
    inputs: Vec<Vec<usize>>,
    /// Items past the picture's limit.
    left_out: usize,
}

/// The graph behind `t` in rows by distance from it.
fn layered(t: &Tensor) -> Layered {
    let mut items: Vec<Item> = Vec::new();
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut inputs: Vec<Vec<usize>> = Vec::new();
    let mut level: Vec<usize> = Vec::new();
    let Some(meta) = crate::autograd::graph::meta_arc(t) else {
        return Layered {
            rows: Vec::new(),
            items,
            inputs,
            left_out: 0,
        };
    };
    let root = match &meta.grad_fn {
        Some(n) => Item::Node(n.clone()),
        None => Item::Leaf(meta.clone()),
    };
    let mut left_out = 0;
    index.insert(root.key(), 0);
    items.push(root);
    inputs.push(Vec::new());
    level.push(0);
    // Breadth first from the root: a row is the distance from the tensor; an item reached
    // again moves down to below its deepest parent (so arrows point down).
    let mut k = 0;
    while k < items.len() {
        let edges: Vec<Item> = match &items[k] {
            Item::Node(n) => n
                .edges
                .iter()
                .filter_map(|e| match e {
                    Edge::None => None,
                    Edge::Leaf(m) => Some(Item::Leaf(m.clone())),
                    Edge::Node(n) => Some(Item::Node(n.clone())),
                })
                .collect(),
            Item::Leaf(_) => Vec::new(),
        };
        for e in edges {
            let j = match index.get(&e.key()) {
                Some(&j) => {
                    level[j] = level[j].max(level[k] + 1);
                    j
                }
                None if items.len() < MAX_ITEMS => {
                    index.insert(e.key(), items.len());
                    items.push(e);
                    inputs.push(Vec::new());
                    level.push(level[k] + 1);
                    items.len() - 1
                }
                None => {
                    left_out += 1;
                    continue;
                }
            };
            if !inputs[k].contains(&j) {
                inputs[k].push(j);
            }
        }
        k += 1;
    }
    // Children placed after their parents' levels were raised: settle levels (a chain of
    // raises, bounded by the item count).
    for _ in 0..items.len() {
        let mut changed = false;
        for k in 0..items.len() {
            for &j in &inputs[k] {
                if level[j] <= level[k] {
                    level[j] = level[k] + 1;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let rows = level.iter().copied().max().map_or(0, |m| m + 1);
    let mut by_row = vec![Vec::new(); rows];
    for (k, &l) in level.iter().enumerate() {
        by_row[l].push(k);
    }
    Layered {
        rows: by_row,
        items,
        inputs,
        left_out,
    }
}

/// The kernel each node's output was computed in, for nodes that share one with another.
fn kernels(items: &[Item]) -> HashMap<usize, usize> {
    let mut ids: HashMap<u64, Vec<usize>> = HashMap::new();
    for (k, item) in items.iter().enumerate() {
        if let Item::Node(n) = item {
            if let Some(&id) = n.computed_in.get() {
                ids.entry(id).or_default().push(k);
            }
        }
    }
    let mut groups: Vec<(u64, Vec<usize>)> = ids.into_iter().filter(|(_, v)| v.len() > 1).collect();
    groups.sort();
    let mut out = HashMap::new();
    for (g, (_, members)) in groups.into_iter().enumerate() {
        for k in members {
            out.insert(k, g);
        }
    }
    out
}

/// The picture's SVG.
pub(crate) fn render(t: &Tensor) -> String {
    let Layered {
        rows,
        items,
        inputs,
        left_out,
    } = layered(t);
    let mut s = String::new();
    if items.is_empty() {
        let _ = write!(
            s,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"360\" height=\"40\">\
             <rect width=\"360\" height=\"40\" fill=\"#ffffff\" rx=\"6\"/>\
             <text x=\"12\" y=\"25\" font-family=\"monospace\" font-size=\"12\" fill=\"#24292f\">\
             no backward graph: this tensor does not require a gradient</text></svg>"
        );
        return s;
    }
    let text: Vec<Vec<String>> = items.iter().map(lines).collect();
    let width_of =
        |k: usize| text[k].iter().map(|l| l.chars().count()).max().unwrap_or(0) * CHAR_W + 16;
    let row_width = |r: &Vec<usize>| -> usize {
        r.iter().map(|&k| width_of(k)).sum::<usize>() + COL_GAP * r.len().saturating_sub(1)
    };
    let kernel_of = kernels(&items);
    let n_kernels = kernel_of.values().copied().max().map_or(0, |m| m + 1);
    let legend_h = 18 * (n_kernels + usize::from(left_out > 0));
    let caption = format!(
        "backward graph of a {} tensor: gradients flow down, from the tensor to its leaves",
        shape_text(t.dtype(), t.shape())
    );
    let w = rows
        .iter()
        .map(row_width)
        .max()
        .unwrap_or(0)
        .max(caption.chars().count() * CHAR_W)
        + 2 * MARGIN;
    let h = TOP + rows.len() * (BOX_H + ROW_GAP) + legend_h + MARGIN;
    // Each item's box: left, top, width.
    let mut place: HashMap<usize, (usize, usize, usize)> = HashMap::new();
    for (r, row) in rows.iter().enumerate() {
        let mut x = (w - row_width(row)) / 2;
        let y = TOP + r * (BOX_H + ROW_GAP);
        for &k in row {
            place.insert(k, (x, y, width_of(k)));
            x += width_of(k) + COL_GAP;
        }
    }
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"monospace\" font-size=\"12\">\
         <rect width=\"{w}\" height=\"{h}\" fill=\"#ffffff\" rx=\"6\"/>\
         <defs><marker id=\"strata-arrow\" markerWidth=\"8\" markerHeight=\"8\" refX=\"7\" \
         refY=\"4\" orient=\"auto\"><path d=\"M0,0 L8,4 L0,8 z\" fill=\"#57606a\"/></marker></defs>\
         <text x=\"{MARGIN}\" y=\"20\" fill=\"#24292f\">{}</text>",
        escape(&caption)
    );
    for (k, ins) in inputs.iter().enumerate() {
        let (x0, y0, w0) = place[&k];
        for j in ins {
            let (x1, y1, w1) = place[j];
            let _ = write!(
                s,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#57606a\" \
                 stroke-width=\"1.2\" marker-end=\"url(#strata-arrow)\"/>",
                x0 + w0 / 2,
                y0 + BOX_H,
                x1 + w1 / 2,
                y1 - 2
            );
        }
    }
    for (k, item) in items.iter().enumerate() {
        let (x, y, bw) = place[&k];
        let (fill, rx, dash) = match item {
            Item::Leaf(_) => ("#f6f8fa", 16, ""),
            Item::Node(_) => (
                kernel_of
                    .get(&k)
                    .map_or("#ffffff", |&g| KERNEL_FILLS[g % KERNEL_FILLS.len()]),
                4,
                "",
            ),
        };
        let _ = write!(
            s,
            "<g class=\"{}\"><rect x=\"{x}\" y=\"{y}\" width=\"{bw}\" height=\"{BOX_H}\" \
             rx=\"{rx}\" fill=\"{fill}\" stroke=\"#57606a\"{dash}/>",
            match item {
                Item::Node(_) => "node",
                Item::Leaf(_) => "leaf",
            }
        );
        for (i, line) in text[k].iter().enumerate() {
            let weight = if i == 0 { " font-weight=\"bold\"" } else { "" };
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"#24292f\"{weight}>{}</text>",
                x + 8,
                y + 15 + 15 * i,
                escape(line)
            );
        }
        s.push_str("</g>");
    }
    let mut y = TOP + rows.len() * (BOX_H + ROW_GAP) + 4;
    for g in 0..n_kernels {
        let mut names: Vec<&str> = kernel_of
            .iter()
            .filter(|(_, &v)| v == g)
            .filter_map(|(&k, _)| match &items[k] {
                Item::Node(n) => Some(n.name),
                Item::Leaf(_) => None,
            })
            .collect();
        names.sort_unstable();
        let _ = write!(
            s,
            "<rect x=\"{MARGIN}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\" \
             stroke=\"#57606a\"/><text x=\"{}\" y=\"{}\" fill=\"#24292f\">one fused \
             kernel computed {}</text>",
            y - 10,
            KERNEL_FILLS[g % KERNEL_FILLS.len()],
            MARGIN + 18,
            y,
            escape(&names.join(", "))
        );
        y += 18;
    }
    if left_out > 0 {
        let _ = write!(
            s,
            "<text x=\"{MARGIN}\" y=\"{y}\" fill=\"#57606a\">… and {left_out} more inputs \
             not drawn (the picture shows at most {MAX_ITEMS} boxes)</text>"
        );
    }
    s.push_str("</svg>");
    s
}

impl Tensor {
    /// A picture of the backward graph behind this tensor (see the module notes): op nodes
    /// with what they saved, leaves with whether a gradient reached them, and the ops one
    /// fused kernel computed in one colour. It reads the graph only: no values, no
    /// synchronization.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::ones([3], DType::F32, &dev)?.requires_grad_(true)?;
    /// let y = x.mul(2.0)?.exp()?.sum(strata_core::ops::Axes::All, false)?;
    /// let svg = y.graph_svg().to_string();
    /// assert!(svg.contains("SumBackward") && svg.contains("ExpBackward") && svg.contains("leaf"));
    /// assert_eq!(svg.matches("class=\"node\"").count(), 3);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn graph_svg(&self) -> Svg {
        Svg(render(self))
    }
}
