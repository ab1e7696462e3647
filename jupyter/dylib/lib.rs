//! strata as one shared library (`dylib`), for the Jupyter kernel's cells: the kernel's
//! `:dep strata = { package = "strata-dylib", … }` names it `strata`, so cells write
//! `strata::…` as anywhere else, and every cell links this one copy of strata's code and
//! statics instead of carrying its own (see `jupyter/src/kernelspec.rs`).
//!
//! ```
//! use strata_dylib::prelude::*;
//! let t = Tensor::ones([2], DType::F32, &Device::cpu())?;
//! assert_eq!(t.to_vec::<f32>()?, [1.0, 1.0]);
//! # Ok::<(), strata_dylib::Error>(())
//! ```
pub use strata::*;
