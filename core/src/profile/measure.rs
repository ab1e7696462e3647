//! What a kernel moves and computes, from its IR and operands: the bytes each operand reads
//! or writes, the operation count, and the names of the ops it holds.

use super::{ProfileRecord, RecordKind};
use crate::backend::{KernelArgs, Operand};
use crate::backend::{LaunchDescription, StreamId};
use crate::ir::{ConvPass, Expr, IndexKind, Kernel, Node};

/// The record of one launch of `kernel` (times filled in by the recorder).
pub(super) fn kernel_record(
    kernel: &Kernel,
    args: &KernelArgs,
    stream: StreamId,
    launch: Option<LaunchDescription>,
    fused_ops: Option<Vec<String>>,
) -> ProfileRecord {
    let (default_name, ops, flops) = match kernel {
        Kernel::Map { expr, .. } => {
            let n = args.outputs.first().map_or(0, |o| o.layout.numel()) as u64;
            ("map", map_ops(expr), n * expr_flops(expr))
        }
        Kernel::Reduce {
            op, map, prologue, ..
        } => {
            let n = args.inputs.first().map_or(0, |i| i.layout.numel()) as u64;
            let mut ops: Vec<String> = prologue.iter().map(|p| p.op.name()).collect();
            ops.extend(map.as_ref().map(map_ops).unwrap_or_default());
            ops.push(op.name());
            let passes = 1 + u64::from(prologue.is_some());
            (
                "reduce",
                ops,
                n * (passes + map.as_ref().map_or(0, expr_flops)),
            )
        }
        Kernel::Matmul { .. } => ("matmul", vec!["matmul".to_string()], matmul_flops(args)),
        Kernel::Softmax { log } => {
            let n = args.inputs.first().map_or(0, |i| i.layout.numel()) as u64;
            let name = if *log { "log_softmax" } else { "softmax" };
            // Per element: a max, a subtract, an exp, an add and a divide (or log's forms).
            (name, vec![name.to_string()], 5 * n)
        }
        Kernel::Index { kind, .. } => {
            let name = match kind {
                IndexKind::Gather => "gather",
                IndexKind::Scatter => "scatter",
                IndexKind::ScatterAdd => "scatter_add",
            };
            (name, vec![name.to_string()], 0)
        }
        Kernel::Convolution { pass, .. } => {
            let name = pass.name();
            (
                "convolution",
                vec![name.to_string()],
                conv_flops(*pass, args),
            )
        }
        Kernel::LayerNorm { .. } => {
            let n = args.inputs.first().map_or(0, |i| i.layout.numel()) as u64;
            let name = "layer_norm";
            // Per element: two sums' terms (3), the normalization (2) and γ, β (2).
            (name, vec![name.to_string()], 7 * n)
        }
        Kernel::LayerNormBackward { .. } => {
            let n = args.inputs.first().map_or(0, |i| i.layout.numel()) as u64;
            let name = "layer_norm_backward";
            // Per element: x̂ (2), ĝ, three sums' terms (3), dx (4) and two column sums (3).
            (name, vec![name.to_string()], 13 * n)
        }
        Kernel::ChannelMoments => {
            let n = args.inputs.first().map_or(0, |i| i.layout.numel()) as u64;
            let name = "channel_moments";
            // Per element (a round's share): the round's sum and squared deviations (4), the
            // merge's few operations spread over the round's values.
            (name, vec![name.to_string()], 5 * n)
        }
        Kernel::ChannelGradSums => {
            let n = args.inputs.first().map_or(0, |i| i.layout.numel()) as u64;
            let name = "channel_grad_sums";
            // Per element: `x − mean`, the two sums' terms.
            (name, vec![name.to_string()], 4 * n)
        }
        Kernel::Histogram { bin, .. } => {
            let n = args.inputs.first().map_or(0, |i| i.layout.numel()) as u64;
            let mut ops = map_ops(bin);
            ops.push("histogram".to_string());
            // The bin's expression and one add per element.
            ("histogram", ops, n * (1 + expr_flops(bin)))
        }
    };
    let (bytes_read, bytes_written) = bytes_moved(kernel, args);
    let (name, launch) = match launch {
        Some(l) => (l.name, Some(l.shape)),
        None => (default_name.to_string(), None),
    };
    let mut record = ProfileRecord::new(RecordKind::Kernel, name, stream);
    record.ops = match crate::backward_scope::running_backward() {
        // A kernel a backward function launched (a reduction, a matmul, an index op).
        Some(node) if fused_ops.is_none() => vec![node.to_string()],
        _ => fused_ops.unwrap_or(ops),
    };
    record.launch = launch;
    record.bytes_read = bytes_read;
    record.bytes_written = bytes_written;
    record.flops = flops;
    record
}

/// Bytes of the distinct elements a view addresses (a stride-0 axis counts once).
fn distinct_bytes(o: &Operand) -> u64 {
    let l = &o.layout;
    let elements: u64 = l
        .shape()
        .iter()
        .zip(l.strides())
        .map(|(&d, &s)| if s == 0 && d > 0 { 1 } else { d as u64 })
        .product();
    elements * o.dtype.itemsize() as u64
}

/// A convolution pass's operations: two per multiply-add, `y`'s elements times a weight's
/// filter (`w`'s elements over its output channels), whichever pass.
fn conv_flops(pass: ConvPass, args: &KernelArgs) -> u64 {
    let shape = |o: Option<&Operand>| o.map(|o| o.layout.shape().to_vec()).unwrap_or_default();
    let (y, w) = match pass {
        ConvPass::Forward => (shape(args.outputs.first()), shape(args.inputs.get(1))),
        ConvPass::BackwardData => (shape(args.inputs.first()), shape(args.inputs.get(1))),
        ConvPass::BackwardFilter => (shape(args.inputs.get(1)), shape(args.outputs.first())),
    };
    let filter: usize = w.iter().skip(1).product();
    2 * (y.iter().product::<usize>() * filter) as u64
}

/// Bytes of every element of a view (each is touched once).
fn all_bytes(o: &Operand) -> u64 {
    o.layout.numel() as u64 * o.dtype.itemsize() as u64
}

fn bytes_moved(kernel: &Kernel, args: &KernelArgs) -> (u64, u64) {
    let written: u64 = args.outputs.iter().map(all_bytes).sum();
    match kernel {
        Kernel::Index { kind, .. } => {
            let index = args.inputs.get(1).map_or(0, all_bytes);
            let moved = match kind {
                // Each output element reads one source element.
                IndexKind::Gather => written,
                // Each index position moves one source element.
                _ => args.inputs.get(1).map_or(0, |i| {
                    i.layout.numel() as u64 * args.outputs[0].dtype.itemsize() as u64
                }),
            };
            match kind {
                IndexKind::Gather => (moved + index, written),
                _ => (moved + index, moved),
            }
        }
        _ => (args.inputs.iter().map(distinct_bytes).sum(), written),
    }
}

/// Operations per output element: one per unary or binary node, two per fused multiply-add.
fn expr_flops(e: &Expr) -> u64 {
    match &e.node {
        Node::Input(_)
        | Node::Scalar(_)
        | Node::Literal(_)
        | Node::LinearIndex
        | Node::Philox(_) => 0,
        Node::Cast { arg, .. } | Node::Bitcast(arg) => expr_flops(arg),
        Node::Unary(_, a) => 1 + expr_flops(a),
        Node::Binary(_, a, b) => 1 + expr_flops(a) + expr_flops(b),
        Node::Fma(a, b, c) => 2 + expr_flops(a) + expr_flops(b) + expr_flops(c),
        Node::Where(a, b, c) => expr_flops(a) + expr_flops(b) + expr_flops(c),
    }
}

/// The operations of a map in evaluation order; `copy` for a bare input, `fill` for a value.
fn map_ops(e: &Expr) -> Vec<String> {
    fn walk(e: &Expr, out: &mut Vec<String>) {
        match &e.node {
            Node::Input(_) | Node::Scalar(_) | Node::Literal(_) => {}
            Node::LinearIndex => out.push("arange".into()),
            Node::Philox(_) => out.push("random".into()),
            Node::Cast { arg, .. } => {
                walk(arg, out);
                out.push(format!("to_{}", e.dtype));
            }
            Node::Bitcast(a) => {
                walk(a, out);
                out.push(format!("bits_as_{}", e.dtype));
            }
            Node::Unary(op, a) => {
                walk(a, out);
                out.push(op.name());
            }
            Node::Binary(op, a, b) => {
                walk(a, out);
                walk(b, out);
                out.push(op.name());
            }
            Node::Fma(..) | Node::Where(..) => {
                e.children().for_each(|x| walk(x, out));
                let name = if matches!(e.node, Node::Fma(..)) {
                    "fma"
                } else {
                    "where"
                };
                out.push(name.into());
            }
        }
    }
    let mut out = Vec::new();
    walk(e, &mut out);
    if out.is_empty() {
        out.push(match e.node {
            Node::Input(_) => "copy".into(),
            _ => "fill".into(),
        });
    }
    out
}

/// `2·batch·m·n·k` from `A [batch, m, k]` and the output `[batch, m, n]`.
fn matmul_flops(args: &KernelArgs) -> u64 {
    let (Some(a), Some(c)) = (args.inputs.first(), args.outputs.first()) else {
        return 0;
    };
    let k = a.layout.shape().last().copied().unwrap_or(0) as u64;
    2 * c.layout.numel() as u64 * k
}
