//! The one error type of strata. Every public API that can fail returns [`Result`].

use crate::dtype::DType;

/// Everything that can go wrong in strata, each variant naming the values involved.
///
/// ```
/// use strata_core::{Device, DType, Error, Tensor};
/// let dev = Device::cpu();
/// let t = Tensor::zeros([2, 3], DType::F32, &dev).unwrap();
/// let err = t.reshape([4]).unwrap_err();
/// assert!(matches!(err, Error::Shape(_)));
/// assert!(err.to_string().contains("[2, 3]"));
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit together (reshape, broadcast, host data length, ...).
    #[error("shape error: {0}")]
    Shape(String),
    /// An index or axis outside its range.
    #[error("index error: {0}")]
    Index(String),
    /// A dtype that the operation does not accept, or the wrong element type on the host.
    #[error("dtype error: {0}")]
    DType(String),
    /// An element type asked for on the host that differs from the tensor's dtype.
    #[error("dtype mismatch: the tensor holds {actual}, but {requested} was requested")]
    DTypeMismatch {
        /// The dtype of the tensor.
        actual: DType,
        /// The dtype of the Rust element type the caller asked for.
        requested: DType,
    },
    /// An argument with a value the operation cannot use.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Operands that live on different devices.
    #[error("device mismatch: {0}")]
    DeviceMismatch(String),
    /// The device could not satisfy an allocation, even after emptying its cache.
    #[error("out of memory: requested {requested} bytes, {free} bytes free{context}")]
    OutOfMemory {
        /// Bytes requested.
        requested: usize,
        /// Bytes the device reported free.
        free: usize,
        /// What needed the memory, when it was not the call that returned the error (`, for
        /// …`; empty otherwise): the deferred work a read ran.
        context: String,
    },
    /// A backend cannot run this operation or dtype; the message says what to use instead.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// No driver or device found for a backend.
    #[error("device not available: {0}")]
    DeviceUnavailable(String),
    /// An error reported by a backend's runtime (driver, compiler, validation).
    #[error("backend error: {0}")]
    Backend(String),
}

impl Error {
    /// An [`Error::OutOfMemory`] for `requested` bytes with `free` bytes free.
    ///
    /// ```
    /// let e = strata_core::Error::out_of_memory(1 << 40, 0);
    /// assert_eq!(e.to_string(), "out of memory: requested 1099511627776 bytes, 0 bytes free");
    /// ```
    pub fn out_of_memory(requested: usize, free: usize) -> Error {
        Error::OutOfMemory {
            requested,
            free,
            context: String::new(),
        }
    }

    /// The same error, kind and values kept, saying that it came from `what` (deferred work
    /// that ran later than the call that recorded it): its message gains `what` in front, or
    /// at the end for the variants whose message is made of values.
    ///
    /// ```
    /// use strata_core::Error;
    /// let e = Error::Backend("launch failed".into()).context("the fused kernel of exp");
    /// assert_eq!(e.to_string(), "backend error: the fused kernel of exp: launch failed");
    /// let oom = Error::out_of_memory(8, 0).context("the fused kernel of exp");
    /// assert!(matches!(oom, Error::OutOfMemory { requested: 8, .. }));
    /// assert!(oom.to_string().ends_with("0 bytes free, for the fused kernel of exp"));
    /// ```
    pub fn context(self, what: &str) -> Error {
        let with = |m: String| format!("{what}: {m}");
        match self {
            Error::Shape(m) => Error::Shape(with(m)),
            Error::Index(m) => Error::Index(with(m)),
            Error::DType(m) => Error::DType(with(m)),
            Error::Invalid(m) => Error::Invalid(with(m)),
            Error::DeviceMismatch(m) => Error::DeviceMismatch(with(m)),
            Error::Unsupported(m) => Error::Unsupported(with(m)),
            Error::DeviceUnavailable(m) => Error::DeviceUnavailable(with(m)),
            Error::Backend(m) => Error::Backend(with(m)),
            Error::OutOfMemory {
                requested,
                free,
                context,
            } => Error::OutOfMemory {
                requested,
                free,
                context: format!("{context}, for {what}"),
            },
            e @ Error::DTypeMismatch { .. } => e,
        }
    }
}

/// `Result` with strata's [`Error`].
///
/// ```
/// fn first(t: &strata_core::Tensor) -> strata_core::Result<f32> {
///     t.flatten()?.narrow(0, 0, 1)?.item::<f32>()
/// }
/// let dev = strata_core::Device::cpu();
/// let t = strata_core::Tensor::from_slice(&[5.0f32, 6.0], [2], &dev).unwrap();
/// assert_eq!(first(&t).unwrap(), 5.0);
/// ```
pub type Result<T> = std::result::Result<T, Error>;
