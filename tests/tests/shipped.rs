//! On CUDA the kernels common first calls launch ship compiled (`cuda-backend/shipped`): a new
//! process's first reduction, softmax, index, cast or random draw loads machine code instead of
//! waiting for NVRTC. One test, in its own process, with an empty kernel cache (set before any
//! device opens), so nothing is found compiled on disk. Elsewhere (no GPU, an architecture the
//! archive lacks, `STRATA_CUDA_SHIPPED=0`) it says why it checks nothing.

use strata::prelude::*;
use strata_cuda::shipped::nvrtc_compiles;

type Call = (&'static str, fn(&Tensor, &Tensor) -> Result<Tensor>);

/// First calls of each kind over [256, 1000] f32 (`x`) and four row indices (`rows`), as
/// `ship_kernels` records them: single ops (a fused chain of two casts, say, is a kernel of its
/// own, which the archive need not hold; the map interpreter runs its first call).
const CALLS: &[Call] = &[
    ("sum over axis 0", |x, _| x.sum(0, false)),
    ("max over axis -1", |x, _| x.max(-1, false)),
    ("argmax over axis -1", |x, _| x.argmax(Some(-1), false)),
    ("mean of all", |x, _| x.mean(Axes::All, false)),
    ("softmax", |x, _| x.softmax(-1)),
    ("log_softmax", |x, _| x.log_softmax(-1)),
    ("softmax from primitives", |x, _| {
        let e = x.sub(&x.max(-1, true)?)?.exp()?;
        e.div(&e.sum(-1, true)?)
    }),
    ("index_select axis 0", |x, rows| x.index_select(0, rows)),
    ("cast to bf16", |x, _| x.to_dtype(DType::BF16)),
    ("cast to f16", |x, _| x.to_dtype(DType::F16)),
    ("randn", |x, _| {
        let mut g = Generator::new(5);
        Tensor::randn([256, 1000], DType::F32, &mut g, x.device())
    }),
];

#[test]
fn common_first_calls_load_shipped_kernels_without_waiting_for_nvrtc() {
    let dir = std::env::temp_dir().join(format!("strata-shipped-{}", std::process::id()));
    std::env::set_var("STRATA_CACHE_DIR", &dir);
    let mut checked = 0;
    for dev in strata_tests::devices() {
        if dev.kind() != strata::BackendKind::Cuda {
            continue;
        }
        if !strata_cuda::shipped::serves(0) {
            println!(
                "{}: the shipped archive does not serve it; nothing checked",
                dev.name()
            );
            continue;
        }
        let run = || -> Result<()> {
            let x = Tensor::arange(0.0, 256_000.0, 1.0, DType::F32, &dev)?
                .reshape([256, 1000])?
                .mul(1e-3)?;
            let rows = Tensor::from_slice(&[3i64, 0, 255, 7], [4], &dev)?;
            dev.synchronize()?;
            for (name, f) in CALLS {
                let before = nvrtc_compiles();
                let y = f(&x, &rows)?;
                y.realize()?;
                dev.synchronize()?;
                assert_eq!(
                    nvrtc_compiles(),
                    before,
                    "{name} on {}: its first call waited for NVRTC, so the shipped archive \
                     lacks its kernel; regenerate it (`bash scripts/gpu-run.sh ship`)",
                    dev.name()
                );
                // The same values as the CPU's.
                let cpu = f(
                    &x.to_device(&Device::cpu())?,
                    &rows.to_device(&Device::cpu())?,
                )?;
                let (got, want) = (y.to_dtype(DType::F64)?, cpu.to_dtype(DType::F64)?);
                let (got, want) = (got.to_vec::<f64>()?, want.to_vec::<f64>()?);
                let close = got.iter().zip(&want).all(|(a, b)| {
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0)
                        || name.contains("bf16") && (a - b).abs() <= 1e-2 * b.abs().max(1.0)
                });
                assert!(close && got.len() == want.len(), "{name} on {}", dev.name());
            }
            Ok(())
        };
        run().unwrap_or_else(|e| panic!("on {}: {e}", dev.name()));
        checked += 1;
    }
    if checked == 0 {
        println!("no CUDA device served by the shipped archive: nothing checked");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
