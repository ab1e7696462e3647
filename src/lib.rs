//! # strata
//!
//! GPU tensors to explore interactively: one [`Tensor`] type on a CUDA, a wgpu and a CPU
//! backend, with PyTorch's semantics for views, broadcasting and dtypes.
//!
//! This facade re-exports [`strata_core`] and adds device discovery: [`DeviceExt::auto`]
//! picks the best backend present (honouring `STRATA_DEVICE=cpu|cuda:N|wgpu`).
//!
//! ```
//! use strata::prelude::*;
//! let dev = Device::auto()?;
//! let t = Tensor::arange(0, 6, 1, DType::I64, &dev)?.reshape([2, 3])?;
//! println!("{t}");
//! assert_eq!(t.slice(s![.., -1])?.to_vec::<i64>()?, vec![2, 5]);
//! # Ok::<(), strata::Error>(())
//! ```
#![warn(missing_docs)]

pub use strata_core::*;

/// Everything a notebook or program usually needs: `use strata::prelude::*;`.
///
/// ```
/// use strata::prelude::*;
/// let t = Tensor::ones([2], DType::F32, &Device::cpu()).unwrap();
/// assert_eq!(t.slice(s![-1]).unwrap().item::<f32>().unwrap(), 1.0);
/// ```
pub mod prelude {
    pub use crate::DeviceExt;
    pub use strata_core::autograd::{self, no_grad};
    pub use strata_core::ops::Axes;
    pub use strata_core::random::Generator;
    pub use strata_core::{
        s, Category, DType, Device, Ellipsis, Error, Event, NewAxis, Result, Scalar, Stream,
        Tensor, Value,
    };
}

/// Collectives over several devices of this process (issue 41): all-reduce, broadcast,
/// reduce, all-gather and reduce-scatter, one tensor per device ([`Communicator`](
/// collective::Communicator)), run by NCCL on CUDA devices.
///
/// ```
/// use strata::prelude::*;
/// use strata::collective::{nccl, ReduceOp};
/// // NCCL runs on CUDA devices only.
/// assert!(nccl(&[Device::cpu()]).is_err());
/// if Device::cuda_count() >= 2 {
///     let devices = [Device::cuda(0)?, Device::cuda(1)?];
///     if let Ok(comm) = nccl(&devices) {
///         let ts: Vec<Tensor> = devices.iter().map(|d| Tensor::ones([4], DType::F32, d)).collect::<Result<_>>()?;
///         comm.all_reduce(&ts, ReduceOp::Sum)?;
///         assert_eq!(ts[1].to_vec::<f32>()?, vec![2.0; 4]);
///     }
/// }
/// # Ok::<(), strata::Error>(())
/// ```
pub mod collective {
    pub use strata_core::collective::*;
    use strata_core::{Device, Error, Result};

    /// A new NCCL id, as 256 hex digits: a launcher makes one and gives it to every process
    /// of a communicator (with `RANK` and `WORLD_SIZE`, as torchrun names them), in
    /// `STRATA_NCCL_ID` for [`nccl_from_env`], across machines too.
    pub fn nccl_id() -> Result<String> {
        #[cfg(feature = "cuda")]
        {
            let id = strata_cuda::Nccl::unique_id()?;
            Ok(id.iter().map(|b| format!("{b:02x}")).collect())
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(no_cuda())
        }
    }

    /// This process's part of a communicator of `world` devices across processes (one
    /// process per GPU, the launcher pattern torchrun uses): `device` as rank `rank`, every
    /// process given the same `id` ([`nccl_id`]). Blocks until every rank has joined.
    pub fn nccl_rank(device: &Device, rank: usize, world: usize, id: &str) -> Result<Communicator> {
        let bad = || {
            Error::Invalid(format!(
                "an NCCL id is 256 hex digits (from nccl_id), not {:?}",
                id.chars().take(16).collect::<String>()
            ))
        };
        if id.len() != 256 || !id.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; 128];
        for (k, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&id[2 * k..2 * k + 2], 16).map_err(|_| bad())?;
        }
        let ordinal = cuda_ordinals(std::slice::from_ref(device))?[0];
        #[cfg(feature = "cuda")]
        {
            let engine =
                std::sync::Arc::new(strata_cuda::Nccl::new_rank(ordinal, rank, world, bytes)?);
            Communicator::with_ranks(vec![device.clone()], vec![rank], world, engine)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (ordinal, rank, world, bytes);
            Err(no_cuda())
        }
    }

    /// [`nccl_rank`] with the rank, world size and id a launcher put in the environment:
    /// `RANK`, `WORLD_SIZE` and `STRATA_NCCL_ID`.
    pub fn nccl_from_env(device: &Device) -> Result<Communicator> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| {
                Error::Invalid(format!(
                    "{name} is not set: a launcher sets RANK, WORLD_SIZE and STRATA_NCCL_ID"
                ))
            })
        };
        let number = |name: &str| -> Result<usize> {
            var(name)?
                .trim()
                .parse()
                .map_err(|_| Error::Invalid(format!("{name} is not a number")))
        };
        nccl_rank(
            device,
            number("RANK")?,
            number("WORLD_SIZE")?,
            &var("STRATA_NCCL_ID")?,
        )
    }

    /// The CUDA ordinal of each device (each GPU once), or `Err` naming a device that is not
    /// CUDA or a GPU given twice.
    fn cuda_ordinals(devices: &[Device]) -> Result<Vec<usize>> {
        let mut ordinals: Vec<usize> = Vec::with_capacity(devices.len());
        for d in devices {
            let ordinal = match d.backend().dlpack_device() {
                Some(at) if d.kind() == strata_core::BackendKind::Cuda => at.device_id as usize,
                _ => {
                    return Err(Error::Unsupported(format!(
                        "NCCL runs collectives on CUDA devices; {} is not one",
                        d.name()
                    )))
                }
            };
            if ordinals.contains(&ordinal) {
                return Err(Error::Invalid(format!(
                    "a communicator takes each GPU once: cuda:{ordinal} is there twice"
                )));
            }
            ordinals.push(ordinal);
        }
        Ok(ordinals)
    }

    #[cfg(not(feature = "cuda"))]
    fn no_cuda() -> Error {
        Error::DeviceUnavailable(
            "this build of strata has no CUDA backend (feature `cuda`), so no NCCL".into(),
        )
    }

    /// A communicator over the CUDA `devices` (each GPU once) whose collectives NCCL runs
    /// (NCCL is loaded at run time: `Err` saying so where it is absent).
    pub fn nccl(devices: &[Device]) -> Result<Communicator> {
        let ordinals = cuda_ordinals(devices)?;
        #[cfg(feature = "cuda")]
        {
            let engine = std::sync::Arc::new(strata_cuda::Nccl::new(&ordinals)?);
            Communicator::new(devices.to_vec(), engine)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinals;
            Err(no_cuda())
        }
    }
}

/// Device discovery, added to [`Device`] by this facade (core knows no backend).
///
/// ```
/// use strata::prelude::*;
/// let dev = Device::parse("cpu").unwrap();
/// assert_eq!(dev.kind(), strata::BackendKind::Cpu);
/// assert!(Device::parse("tpu").is_err());
/// for i in 0..Device::cuda_count() {
///     assert!(Device::cuda(i).is_ok());
/// }
/// ```
pub trait DeviceExt: Sized {
    /// The best device present: the one `STRATA_DEVICE` names when it is set, otherwise
    /// CUDA device 0, then a wgpu adapter that is real hardware (a software rasterizer such as
    /// lavapipe is slower than the CPU backend; `STRATA_DEVICE=wgpu` still picks it), then the
    /// CPU.
    fn auto() -> Result<Self>;
    /// CUDA device `ordinal`, or `Err` saying why not (no driver, no such device).
    fn cuda(ordinal: usize) -> Result<Self>;
    /// How many CUDA devices the driver reports: 0 without a driver (or without the `cuda`
    /// feature). `Device::cuda(i)` opens each `i` below it.
    fn cuda_count() -> usize;
    /// The wgpu device on the preferred adapter.
    fn wgpu() -> Result<Self>;
    /// A device from a name: `cpu`, `cuda`, `cuda:N` or `wgpu`.
    fn parse(spec: &str) -> Result<Self>;
}

/// The wgpu device, unless its only adapters are software ones (or `STRATA_WGPU_ADAPTER`
/// names one explicitly).
fn hardware_wgpu() -> Result<Device> {
    #[cfg(feature = "wgpu")]
    {
        let chosen = std::env::var("STRATA_WGPU_ADAPTER").is_ok_and(|s| !s.trim().is_empty());
        let hardware = strata_wgpu::adapters()
            .iter()
            .any(|a| a.device_type != strata_wgpu::DeviceType::Cpu);
        if !chosen && !hardware {
            return Err(Error::DeviceUnavailable(
                "wgpu: only software adapters found".into(),
            ));
        }
    }
    Device::wgpu()
}

impl DeviceExt for Device {
    fn auto() -> Result<Device> {
        match std::env::var("STRATA_DEVICE") {
            Ok(spec) if !spec.trim().is_empty() => Device::parse(&spec),
            _ => Ok(Device::cuda(0)
                .or_else(|_| hardware_wgpu())
                .unwrap_or_else(|_| Device::cpu())),
        }
    }

    fn cuda(ordinal: usize) -> Result<Device> {
        #[cfg(feature = "cuda")]
        {
            strata_cuda::open(ordinal)
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(Error::DeviceUnavailable(format!(
                "cuda:{ordinal}: this build of strata has no CUDA backend (feature `cuda`); \
                 use Device::cpu()"
            )))
        }
    }

    fn cuda_count() -> usize {
        #[cfg(feature = "cuda")]
        {
            strata_cuda::device_count()
        }
        #[cfg(not(feature = "cuda"))]
        {
            0
        }
    }

    fn wgpu() -> Result<Device> {
        #[cfg(feature = "wgpu")]
        {
            strata_wgpu::open()
        }
        #[cfg(not(feature = "wgpu"))]
        {
            Err(Error::DeviceUnavailable(
                "wgpu: this build of strata has no wgpu backend (feature `wgpu`); use Device::cpu()"
                    .into(),
            ))
        }
    }

    fn parse(spec: &str) -> Result<Device> {
        let spec = spec.trim().to_ascii_lowercase();
        match spec.as_str() {
            "cpu" => Ok(Device::cpu()),
            "wgpu" => Device::wgpu(),
            "cuda" => Device::cuda(0),
            _ => match spec.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => Device::cuda(i),
                _ => Err(Error::Invalid(format!(
                    "unknown device {spec:?}: use cpu, cuda, cuda:N or wgpu"
                ))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    /// The tour example (built by `cargo test` beside this test) prints no library noise: no
    /// libwayland error lines where XDG_RUNTIME_DIR is unset, no Debug dump of a struct.
    #[test]
    fn the_tour_example_prints_only_its_tour() {
        let exe = std::env::current_exe().expect("the test's path");
        let Some(tour) = exe
            .parent()
            .and_then(|deps| deps.parent())
            .map(|dir| dir.join("examples").join("tour"))
            .filter(|t| t.is_file())
        else {
            eprintln!("examples/tour is not built (cargo test builds it; --lib does not)");
            return;
        };
        let out = std::process::Command::new(tour)
            .env_remove("XDG_RUNTIME_DIR")
            .env("STRATA_DEVICE", "cpu")
            .output()
            .expect("the tour runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert_eq!(stderr, "", "the tour wrote to stderr");
        assert!(stdout.starts_with("device: cpu"), "{stdout}");
        assert!(!stdout.contains(" { "), "a Debug dump:\n{stdout}");
        assert!(stdout.contains("memory: allocated"), "{stdout}");
    }
}
