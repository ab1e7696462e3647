//! # strata-core
//!
//! The semantics of strata: dtypes ([`DType`]), layouts and views ([`Layout`], [`s!`]),
//! the [`Tensor`] type, the kernel IR ([`ir`]) that every op lowers to, the [`Backend`] trait
//! every device implements, the CPU reference backend ([`cpu`]), display and errors.
//! Backends depend on this crate; it names none of them.
//!
//! ```
//! use strata_core::{s, Device, DType, Tensor};
//! let dev = Device::cpu();
//! let t = Tensor::arange(0, 12, 1, DType::I32, &dev)?.reshape([3, 4])?;
//! let v = t.slice(s![1.., ..;-2])?;
//! assert_eq!(v.to_vec::<i32>()?, vec![7, 5, 11, 9]);
//! # Ok::<(), strata_core::Error>(())
//! ```
#![warn(missing_docs)]

mod assign;
pub mod autograd;
pub mod backend;
mod backward_scope;
pub mod collective;
pub mod cpu;
mod creation;
pub mod device;
mod display;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod explain;
mod exponent_histogram;
#[doc(hidden)]
pub mod fault;
pub mod fusion;
pub mod index;
pub mod ir;
pub mod kernel_cache;
pub mod layout;
pub mod lower;
pub mod nn;
mod notebook;
pub mod ops;
mod pinned;
mod profile;
mod profile_record;
pub mod random;
pub mod stochastic_round;
pub mod sync;
pub mod target;
mod tensor;
mod transfer;
mod view;

pub use assign::Value;
pub use backend::{
    Backend, BackendKind, DeviceBuffer, EventId, LaunchDescription, MemoryStats, StreamId,
};
pub use device::{Device, Event, Stream};
pub use dtype::{Category, DType, Element, Scalar};
pub use error::{Error, Result};
pub use index::{Ellipsis, IndexArgs, NewAxis, SliceArg};
pub use layout::{IntoDims, Layout};
pub use notebook::{install_notebook_panic_hook, line_plot, show_layout_pictures, Svg};
pub use profile::{Profile, ProfileRecord, Profiler, RecordKind};
pub use tensor::Tensor;
