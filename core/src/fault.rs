//! Faults a test makes a device's next allocation, kernel compile or launch return, so the
//! failure model (docs/semantics.md) is tested on every backend: what each error says, what
//! state it leaves, that the device keeps working. Hidden from the docs: not for programs.

use crate::error::Error;

/// One injected failure, taken by the next operation of its kind on the device
/// ([`Device::inject_fault`](crate::Device::inject_fault)).
///
/// ```
/// use strata_core::{fault::Fault, Device, DType, Error, Tensor};
/// let dev = Device::cpu();
/// dev.inject_fault(Fault::Allocation);
/// let e = Tensor::zeros([4], DType::F32, &dev).unwrap_err();
/// assert!(matches!(e, Error::OutOfMemory { requested: 16, .. }));
/// assert!(Tensor::zeros([4], DType::F32, &dev).is_ok()); // taken once
/// ```
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next allocation: `Err(OutOfMemory)` for its size, nothing free.
    Allocation,
    /// The next kernel launch fails as a kernel that does not compile would.
    Compile,
    /// The next kernel launch fails as the driver refusing a launch would.
    Launch,
}

impl Fault {
    /// The error the faulted operation returns (`bytes`: an allocation's size; `kernel`: the
    /// kind of kernel launched).
    pub(crate) fn error(self, bytes: usize, kernel: &str) -> Error {
        match self {
            Fault::Allocation => Error::out_of_memory(bytes, 0),
            Fault::Compile => Error::Backend(format!(
                "could not compile the {kernel} kernel (an injected fault; a real compile \
                 error shows the compiler's log with the source line)"
            )),
            Fault::Launch => Error::Backend(format!(
                "the {kernel} kernel's launch failed (an injected fault)"
            )),
        }
    }
}
