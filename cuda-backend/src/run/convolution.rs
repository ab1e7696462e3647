//! A convolution's launch: one cuDNN call (core sends a `Convolution` kernel only when cuDNN
//! is loaded), after a scratch buffer for its algorithm's workspace.

use super::step::Step;
use crate::dnn::{ConvCall, ConvKey, Dnn};
use strata_core::backend::{KernelArgs, Operand};
use strata_core::ir::{ConvGeometry, ConvPass};
use strata_core::{Error, Result};

/// An operand's address and its four sizes, checked contiguous (core makes it so).
fn operand(o: &Operand) -> Result<(u64, [usize; 4])> {
    let (Ok(shape), true) = (
        <[usize; 4]>::try_from(o.layout.shape()),
        o.layout.is_contiguous(),
    ) else {
        return Err(Error::Backend(format!(
            "internal error: a convolution operand of shape {:?}, strides {:?} (contiguous \
             4-D expected)",
            o.layout.shape(),
            o.layout.strides()
        )));
    };
    Ok((crate::memory::element_address(o)?, shape))
}

/// The steps of `Convolution { pass, geometry, tf32 }` over `args`.
pub(crate) fn steps(
    pass: ConvPass,
    geometry: ConvGeometry,
    tf32: bool,
    args: &KernelArgs,
    dnn: Option<&Dnn>,
) -> Result<Vec<Step<'static>>> {
    let Some(dnn) = dnn else {
        return Err(Error::Backend(format!(
            "internal error: a {} kernel planned without cuDNN",
            pass.name()
        )));
    };
    let (Some(out), [a, b]) = (args.outputs.first(), args.inputs.as_slice()) else {
        return Err(Error::Backend(
            "internal error: a convolution takes two inputs and one output".into(),
        ));
    };
    let (out, a, b) = (operand(out)?, operand(a)?, operand(b)?);
    // (x, w, y): which operand plays which part in this pass.
    let (x, w, y) = match pass {
        ConvPass::Forward => (a, b, out),
        ConvPass::BackwardData => (out, b, a),
        ConvPass::BackwardFilter => (a, out, b),
    };
    let key = ConvKey {
        pass,
        geometry,
        dtype: args.outputs[0].dtype,
        tf32,
        x: x.1,
        w: w.1,
        y: y.1,
    };
    let plan = dnn.plan(&key)?;
    let mut steps = Vec::new();
    let workspace = (plan.workspace > 0).then(|| {
        steps.push(Step::Scratch {
            bytes: plan.workspace,
        });
        0
    });
    steps.push(Step::Conv(ConvCall {
        plan,
        x: x.0,
        w: w.0,
        y: y.0,
        workspace,
    }));
    Ok(steps)
}
