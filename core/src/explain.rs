//! [`Tensor::explain`]: the kernels behind a tensor, before they run (lazy fusion) or as they
//! ran, with the user ops each holds, its operands, launch shape and generated source.

use crate::backend::KernelSource;
use crate::dtype::DType;
use crate::error::Result;
use crate::fusion;
use crate::fusion::preview::Preview;
use crate::ir::{Expr, Node};
use crate::layout::Layout;
use crate::notebook::escape;
use crate::tensor::{RunRecord, Tensor};
use std::fmt::{self, Write};

/// What [`Tensor::explain`] found: the kernels still to run for a tensor, in the order they
/// will run, or the fused kernel that computed it.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let a = Tensor::ones([4], DType::F32, &dev)?;
/// let y = (&a * 2.0)?.add(&a)?.relu()?;
/// let e = y.explain()?;
/// if dev.fusion() {
///     assert_eq!(e.kernels.len(), 1);
///     assert_eq!(e.kernels[0].ops, vec!["mul", "add", "relu"]);
/// }
/// println!("{e}");
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Explanation {
    /// The tensor explained: shape, dtype and device.
    pub tensor: String,
    /// Kernels still to run (pending), or the one that computed the tensor (ran).
    pub kernels: Vec<KernelReport>,
    /// What there is to know besides the kernels (eager op, fusion off, ...).
    pub note: String,
}

/// One kernel: what it computes and how it is launched.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let a = Tensor::ones([2], DType::F32, &Device::cpu())?;
/// let y = a.exp()?;
/// for k in y.explain()?.kernels {
///     assert_eq!(k.output.dtype, DType::F32);
/// }
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct KernelReport {
    /// `true` while it has not run.
    pub pending: bool,
    /// The user ops it holds, in the order they were called.
    pub ops: Vec<String>,
    /// Where each op was called (`file:line`), beside `ops`; empty for an op of a notebook
    /// cell (evcxr's generated line would mislead).
    pub sources: Vec<String>,
    /// The expression per output element (`in0`, `s0`: inputs and launch scalars).
    pub expression: String,
    /// The tensors it reads.
    pub inputs: Vec<OperandReport>,
    /// The tensor it writes.
    pub output: OperandReport,
    /// Multi-output fusion: the intermediates it stored as well (someone still held them at
    /// a [`Device::flush`](crate::Device::flush)), each with its expression. Empty before it
    /// runs: a read runs the kernel without them.
    pub also: Vec<StoredIntermediate>,
    /// How many launch scalars it takes.
    pub scalars: usize,
    /// The generated source and launch shape (before the kernel runs; the CPU backend shows
    /// its evaluation plan).
    pub source: Option<KernelSource>,
}

/// An intermediate a fused kernel stores besides its result, because someone still holds it.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let a = Tensor::ones([4], DType::F32, &dev)?;
/// let b = (&a * 2.0)?; // held, so the flush's kernel of `c` stores it too
/// let c = (&b + 1.0)?;
/// dev.flush()?;
/// if dev.fusion() {
///     let k = &c.explain()?.kernels[0];
///     assert_eq!(k.also.len(), 1);
///     assert_eq!(k.also[0].expression, "in0 * s0");
/// }
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct StoredIntermediate {
    /// Its expression, over the kernel's inputs and scalars.
    pub expression: String,
    /// Where it is written.
    pub operand: OperandReport,
}

/// Shape, strides, offset and dtype of one kernel operand.
///
/// ```
/// let o = strata_core::explain::OperandReport {
///     shape: vec![2, 3], strides: vec![3, 1], offset: 0, dtype: strata_core::DType::F32,
/// };
/// assert_eq!(o.to_string(), "[2, 3] f32 strides [3, 1] offset 0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperandReport {
    /// The size of each axis.
    pub shape: Vec<usize>,
    /// Steps in elements (0: broadcast).
    pub strides: Vec<isize>,
    /// Position of the first element.
    pub offset: usize,
    /// Element type.
    pub dtype: DType,
}

impl OperandReport {
    fn of(layout: &Layout, dtype: DType) -> OperandReport {
        OperandReport {
            shape: layout.shape().to_vec(),
            strides: layout.strides().to_vec(),
            offset: layout.offset(),
            dtype,
        }
    }
}

impl fmt::Display for OperandReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} {} strides {:?} offset {}",
            self.shape, self.dtype, self.strides, self.offset
        )
    }
}

impl Tensor {
    /// The work behind this tensor. While it is pending: every kernel that will run to
    /// compute it, in order (a pending input that others share runs as its own kernel
    /// first), each with the user ops it fuses, its inputs and output (shape, strides,
    /// dtype), the launch shape and the generated source (CUDA C, WGSL, or the CPU backend's
    /// evaluation plan). Once a fused kernel has run: that kernel, without source. Displays
    /// as text, and as HTML in a notebook.
    ///
    /// It runs nothing and allocates nothing: the launches are planned over the buffers that
    /// exist, and stand-ins for those not computed yet.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::arange(0, 8, 1, DType::F32, &dev)?;
    /// let y = (&x - 3.0)?.exp()?;
    /// let before = y.explain()?;
    /// y.realize()?;
    /// let after = y.explain()?;
    /// if dev.fusion() {
    ///     assert!(before.kernels[0].pending && !after.kernels[0].pending);
    ///     assert!(before.kernels[0].expression.contains("exp"));
    /// }
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn explain(&self) -> Result<Explanation> {
        let tensor = format!(
            "{:?} {} on {}",
            self.shape(),
            self.dtype(),
            self.device().name()
        );
        let mut kernels = Vec::new();
        for planned in fusion::preview::preview(self)? {
            kernels.push(report(self, planned)?);
        }
        let note = if !kernels.is_empty() {
            format!(
                "{} kernel{} will run when the value is needed",
                kernels.len(),
                if kernels.len() == 1 { "" } else { "s" }
            )
        } else if let Some(ran) = self.storage.ran.get() {
            kernels.push(fused_report(ran, false, None));
            "computed by this fused kernel (explain before it runs to see its source)".into()
        } else if !self.device().defers() {
            "computed eagerly: fusion is off on this device (blocking mode or set_fusion(false))"
                .into()
        } else {
            "computed by an op that is not fused (creation, copy, reduction, matmul, index op, \
             join) or written in place"
                .into()
        };
        Ok(Explanation {
            tensor,
            kernels,
            note,
        })
    }
}

/// The report of one kernel a read of `t` would run.
fn report(t: &Tensor, planned: Preview) -> Result<KernelReport> {
    let map = match planned {
        Preview::Reduce {
            op,
            reduced_axes,
            source,
            output,
            user_op,
            call_site,
            map,
            epilogue,
            stores,
        } => {
            // A deferred reduction: its own kernel when read, the first pass of a later
            // reduction's kernel over the same rows, or (of a tree) the kernel of the
            // elementwise work over its rows that reads it.
            let axes = format!(
                "over its last {reduced_axes} ax{}",
                if reduced_axes == 1 { "is" } else { "es" }
            );
            let mut expression = if map {
                format!(
                    "{}(the pending tree's elements, computed in the kernel) {axes}; a deferred \
                     reduction of the same rows they read (a maximum, minimum or sum) is \
                     computed first in the same kernel",
                    op.name()
                )
            } else {
                format!(
                    "{}(in0) {axes}; a reduction of the same rows that reads it may compute it \
                     in its own kernel",
                    op.name()
                )
            };
            let mut ops = vec![user_op.to_string()];
            let mut sources = vec![crate::fusion::place(call_site)];
            let mut out = OperandReport::of(&output.0, output.1);
            if let Some(r) = &epilogue {
                expression.push_str(&format!(
                    "; then, in the same kernel, each element of the rows: {} (a row epilogue: \
                     each row read once, written once where it stages)",
                    infix(&r.expr)
                ));
                ops.extend(r.ops.iter().map(|s| s.to_string()));
                sources.extend(r.call_sites.iter().map(|l| crate::fusion::place(l)));
                out = OperandReport::of(&r.output.0, r.output.1);
            } else if let Some(r) = &stores {
                expression.push_str(&format!(
                    "; the same kernel stores the tree it reduces, {} (read next: computed \
                     once)",
                    infix(&r.expr)
                ));
                ops.extend(r.ops.iter().map(|s| s.to_string()));
                sources.extend(r.call_sites.iter().map(|l| crate::fusion::place(l)));
            } else if map {
                expression.push_str(
                    "; elementwise work over the same rows that reads it may run last in its \
                     kernel",
                );
            }
            return Ok(KernelReport {
                pending: true,
                ops,
                sources,
                expression,
                inputs: vec![OperandReport::of(&source.0, source.1)],
                output: out,
                also: Vec::new(),
                scalars: 0,
                source: None,
            });
        }
        Preview::Map(map) => map,
    };
    // A read runs no multi-output kernel (see fusion::realize): `also` is empty here.
    let source = t
        .device()
        .backend()
        .map_source(&map.record.expr, &[], &map.args)?;
    Ok(fused_report(&map.record, true, source))
}

/// The report of a fused kernel from its record: one that ran, or one a read would run
/// (`pending`).
fn fused_report(r: &RunRecord, pending: bool, source: Option<KernelSource>) -> KernelReport {
    KernelReport {
        pending,
        ops: r.ops.iter().map(|s| s.to_string()).collect(),
        sources: r
            .call_sites
            .iter()
            .map(|l| crate::fusion::place(l))
            .collect(),
        expression: infix(&r.expr),
        inputs: r
            .inputs
            .iter()
            .map(|(l, d)| OperandReport::of(l, *d))
            .collect(),
        output: OperandReport::of(&r.output.0, r.output.1),
        also: r
            .also
            .iter()
            .map(|(e, l, d)| StoredIntermediate {
                expression: infix(e),
                operand: OperandReport::of(l, *d),
            })
            .collect(),
        scalars: r.scalars,
        source,
    }
}

/// The ops of `kernel` with where they were called: `mul (src/main.rs:12)`, one line each
/// (`mul` alone where the place is left out).
fn ops_with_sources(kernel: &KernelReport) -> Vec<String> {
    kernel
        .ops
        .iter()
        .zip(&kernel.sources)
        .map(|(op, at)| match at.as_str() {
            "" => op.to_string(),
            at => format!("{op} ({at})"),
        })
        .collect()
}

/// The expression in one line: `relu(in0 * in1 + in2)`, casts as `f32(x)`.
///
/// ```
/// use strata_core::{DType, ir::{BinaryOp, Expr}};
/// let e = Expr::binary(BinaryOp::Add, Expr::input(0, DType::F32), Expr::scalar(0, DType::F32));
/// assert_eq!(strata_core::explain::infix(&e), "in0 + s0");
/// ```
pub fn infix(e: &Expr) -> String {
    let mut out = String::new();
    write_infix(e, &mut out, 0);
    out
}

fn write_infix(e: &Expr, out: &mut String, outer: u8) {
    match &e.node {
        Node::Input(k) => {
            let _ = write!(out, "in{k}");
        }
        Node::Scalar(k) => {
            let _ = write!(out, "s{k}");
        }
        Node::Literal(bits) => {
            let _ = write!(out, "{}", crate::dtype::Scalar::from_bits(e.dtype, *bits));
        }
        Node::LinearIndex => out.push_str("index"),
        Node::Philox(w) if w.per_counter <= 1 => {
            let _ = write!(out, "philox{}(index)", w.word);
        }
        Node::Philox(w) => {
            let _ = write!(out, "philox{}(index, {} per counter", w.word, w.per_counter);
            if w.shared > 1 {
                let _ = write!(out, ", pairs");
            }
            out.push(')');
        }
        Node::Cast { arg, saturate } => {
            let _ = write!(out, "{}{}(", e.dtype, if *saturate { "_sat" } else { "" });
            write_infix(arg, out, 0);
            out.push(')');
        }
        Node::Bitcast(a) => {
            let _ = write!(out, "bits_as_{}(", e.dtype);
            write_infix(a, out, 0);
            out.push(')');
        }
        Node::Unary(op, a) => {
            let _ = write!(out, "{}(", op.name());
            write_infix(a, out, 0);
            out.push(')');
        }
        Node::Binary(op, a, b) => {
            let Some((symbol, p)) = op.infix() else {
                let _ = write!(out, "{}(", op.name());
                write_infix(a, out, 0);
                out.push_str(", ");
                write_infix(b, out, 0);
                out.push(')');
                return;
            };
            let paren = p < outer;
            if paren {
                out.push('(');
            }
            write_infix(a, out, p);
            let _ = write!(out, " {symbol} ");
            write_infix(b, out, p + 1);
            if paren {
                out.push(')');
            }
        }
        Node::Fma(a, b, c) | Node::Where(a, b, c) => {
            out.push_str(if matches!(e.node, Node::Fma(..)) {
                "fma("
            } else {
                "where("
            });
            write_infix(a, out, 0);
            out.push_str(", ");
            write_infix(b, out, 0);
            out.push_str(", ");
            write_infix(c, out, 0);
            out.push(')');
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "explain {}: {}", self.tensor, self.note)?;
        for (k, kernel) in self.kernels.iter().enumerate() {
            let state = if kernel.pending { "pending" } else { "ran" };
            writeln!(
                f,
                "kernel {} ({state}): {} ({} op{})",
                k + 1,
                kernel.ops.join(" → "),
                kernel.ops.len(),
                if kernel.ops.len() == 1 { "" } else { "s" }
            )?;
            writeln!(f, "  ops: {}", ops_with_sources(kernel).join(", "))?;
            writeln!(f, "  out = {}", kernel.expression)?;
            for (i, input) in kernel.inputs.iter().enumerate() {
                writeln!(f, "  in{i}: {input}")?;
            }
            writeln!(f, "  out: {}", kernel.output)?;
            for (i, held) in kernel.also.iter().enumerate() {
                writeln!(f, "  also out{} = {}", i + 1, held.expression)?;
                writeln!(
                    f,
                    "  out{}: {} (an intermediate still held)",
                    i + 1,
                    held.operand
                )?;
            }
            if kernel.scalars > 0 {
                writeln!(f, "  launch scalars: {}", kernel.scalars)?;
            }
            if let Some(src) = &kernel.source {
                writeln!(f, "  launch: {}", src.launch)?;
                writeln!(f, "  {}:", src.language)?;
                for line in src.source.lines() {
                    writeln!(f, "    {line}")?;
                }
            }
        }
        Ok(())
    }
}

impl Explanation {
    /// The explanation as HTML: a table per kernel, the source in a collapsible block.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let y = Tensor::ones([3], DType::F32, &Device::cpu())?.exp()?;
    /// assert!(y.explain()?.to_html().contains("<table"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn to_html(&self) -> String {
        let mono = "font-family:monospace;font-size:12px";
        let mut out = format!(
            "<div style=\"{mono}\"><b>explain</b> {} — {}</div>",
            escape(&self.tensor),
            escape(&self.note)
        );
        for (k, kernel) in self.kernels.iter().enumerate() {
            let state = if kernel.pending { "pending" } else { "ran" };
            let _ = write!(
                out,
                "<table style=\"border-collapse:collapse;{mono};margin:6px 0\">\
                 <tr><th colspan=\"2\" style=\"text-align:left\">kernel {} ({state}): {}</th></tr>\
                 <tr><td>ops</td><td>{}</td></tr>\
                 <tr><td style=\"padding-right:12px\">out =</td><td>{}</td></tr>",
                k + 1,
                escape(&kernel.ops.join(" → ")),
                escape(&ops_with_sources(kernel).join(", ")),
                escape(&kernel.expression)
            );
            for (i, input) in kernel.inputs.iter().enumerate() {
                let _ = write!(
                    out,
                    "<tr><td>in{i}</td><td>{}</td></tr>",
                    escape(&input.to_string())
                );
            }
            let _ = write!(
                out,
                "<tr><td>out</td><td>{}</td></tr>",
                escape(&kernel.output.to_string())
            );
            for (i, held) in kernel.also.iter().enumerate() {
                let _ = write!(
                    out,
                    "<tr><td>out{} =</td><td>{}</td></tr>\
                     <tr><td>out{}</td><td>{} (an intermediate still held)</td></tr>",
                    i + 1,
                    escape(&held.expression),
                    i + 1,
                    escape(&held.operand.to_string())
                );
            }
            if let Some(src) = &kernel.source {
                let _ = write!(
                    out,
                    "<tr><td>launch</td><td>{}</td></tr></table>\
                     <details><summary style=\"{mono}\">{} source ({} lines)</summary>\
                     <pre style=\"{mono}\">{}</pre></details>",
                    escape(&src.launch),
                    escape(&src.language),
                    src.source.lines().count(),
                    escape(&src.source)
                );
            } else {
                out.push_str("</table>");
            }
        }
        out
    }

    /// Shows the explanation in an evcxr notebook (text and HTML).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// Tensor::ones([3], DType::F32, &Device::cpu())?.exp()?.explain()?.evcxr_display();
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        crate::notebook::emit(&self.to_string(), &self.to_html(), None);
    }
}
