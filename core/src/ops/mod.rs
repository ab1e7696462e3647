//! Operations: each op's semantics (shape checks, broadcasting, type promotion, output dtype)
//! defined once here and lowered to the kernel IR.

mod elementwise;
mod histogram;
mod index;
mod join;
mod matmul;
mod promote;
pub(crate) mod reduce;

pub use crate::exponent_histogram::ExponentHistogram;
pub use promote::{can_cast, promote_types, result_type, DEFAULT_FLOAT};
pub use reduce::Axes;
