//! Tensors of two devices (issue 41). Every op given tensors of two devices is an `Err` naming
//! both, as PyTorch's cross-device ops are; copies (`to_device`, `assign`) are the exception,
//! and between two CUDA devices they go device to device, ordered by both devices' streams.
//! Runs on every pair of the devices present: cpu and wgpu here; on the GPU machine also
//! cuda:0 with a second device of the same GPU (the device-to-device path on one GPU) and,
//! where there are two GPUs, cuda:0 with cuda:1 (peer to peer).

use strata::prelude::*;
use strata::BackendKind;

/// The devices to pair: the test devices, a second device of the first CUDA GPU and, where
/// present, CUDA device 1.
fn devices() -> Vec<Device> {
    let mut all = strata_tests::devices();
    if all.iter().any(|d| d.kind() == BackendKind::Cuda) {
        all.push(Device::cuda(0).expect("a second device of cuda:0"));
        if Device::cuda_count() >= 2 {
            all.push(Device::cuda(1).expect("cuda:1"));
        } else {
            eprintln!("one CUDA device: peer-to-peer copies between two GPUs are not tested");
        }
    }
    all
}

/// Every pair (a, b) of distinct devices whose tensors cannot meet in one op.
fn mixed_pairs() -> Vec<(Device, Device)> {
    let all = devices();
    let mut pairs = Vec::new();
    for a in &all {
        for b in &all {
            if !a.shares_memory_with(b) {
                pairs.push((a.clone(), b.clone()));
            }
        }
    }
    pairs
}

type Family = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// One op of each family, the first operand on one device and the second on the other.
fn families() -> Vec<(&'static str, Family)> {
    vec![
        ("binary", |x, y| x.add(y)),
        ("comparison", |x, y| x.lt(y)),
        ("in place", |x, y| {
            x.mul_(y)?;
            Ok(x.clone())
        }),
        ("where", |x, y| Tensor::where_cond(&x.gt(0.0)?, x, y)),
        ("clamp", |x, y| x.clamp(y, 10.0)),
        ("fma", |x, y| x.fma(y, 1.0)),
        ("lerp", |x, y| x.lerp(y, 0.5)),
        ("matmul", |x, y| x.matmul(y)),
        ("cat", |x, y| Tensor::cat(&[x, y], 0)),
        ("stack", |x, y| Tensor::stack(&[x, y], 0)),
        ("index_select", |x, y| {
            x.index_select(0, &y.slice(s![0, ..])?.to_dtype(DType::I64)?.mul(0)?)
        }),
        ("gather", |x, y| {
            x.gather(1, &y.to_dtype(DType::I64)?.mul(0)?)
        }),
        ("scatter_add", |x, y| {
            x.scatter_add(1, &y.to_dtype(DType::I64)?.mul(0)?, y)
        }),
        ("masked_fill", |x, y| x.masked_fill(&y.gt(0.0)?, 1.0)),
        ("gradient", |x, y| {
            let w = x.detach().requires_grad_(true)?;
            w.mul(2.0)?.backward_with(y)?;
            Ok(w)
        }),
    ]
}

#[test]
fn every_op_family_refuses_tensors_of_two_devices() {
    for (a, b) in mixed_pairs() {
        for (name, op) in families() {
            let x = Tensor::ones([2, 2], DType::F32, &a).unwrap();
            let y = Tensor::full([2, 2], 2.0, DType::F32, &b).unwrap();
            match op(&x, &y) {
                Err(Error::DeviceMismatch(m)) => assert!(
                    m.contains(&a.name()) && m.contains(&b.name()),
                    "{name} on {} and {}: the message names both: {m}",
                    a.name(),
                    b.name()
                ),
                other => panic!(
                    "{name} on {} and {}: expected a device mismatch, got {other:?}",
                    a.name(),
                    b.name()
                ),
            }
            // Nothing was written: the first operand still holds its ones.
            assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0; 4], "{name}");
        }
    }
}

/// Values of `dtype` that show every byte: 0, 1, 2, … wrapped to the dtype.
fn ramp(n: usize, dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::arange(0.0, n as f64, 1.0, DType::F64, dev)?
        .remainder(97.0)?
        .to_dtype(dtype)
}

#[test]
fn copies_between_devices_keep_every_value() {
    for (a, b) in mixed_pairs() {
        for dtype in strata_tests::dtypes() {
            if a.backend().check_dtype(dtype).is_err() || b.backend().check_dtype(dtype).is_err() {
                continue;
            }
            let what = |case: &str| format!("{case} {dtype} from {} to {}", a.name(), b.name());
            let base = ramp(6 * 167, dtype, &a).unwrap().view([6, 167]).unwrap();
            let cases = [
                ("contiguous", base.clone()),
                ("transposed", base.t().unwrap()),
                ("offset", base.slice(s![2.., 1..]).unwrap()),
                ("stepped", base.slice(s![.., ..;3]).unwrap()),
                ("empty", base.slice(s![..0, ..]).unwrap()),
                ("pending", base.mul(3).unwrap()),
            ];
            for (case, x) in cases {
                let moved = x
                    .to_device(&b)
                    .unwrap_or_else(|e| panic!("{}: {e}", what(case)));
                assert_eq!(moved.device(), &b, "{}", what(case));
                assert_eq!(moved.shape(), x.shape(), "{}", what(case));
                assert_eq!(
                    moved.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                    x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                    "{}",
                    what(case)
                );
            }
            // `assign` copies a tensor of another device into a view (PyTorch's `copy_`).
            let target = Tensor::zeros([6, 167], dtype, &b).unwrap();
            target
                .slice(s![1..3, ..])
                .unwrap()
                .assign(base.slice(s![..2, ..]).unwrap())
                .unwrap();
            let got = target
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            let want = base.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            assert_eq!(&got[167..3 * 167], &want[..2 * 167], "{}", what("assign"));
            assert!(got[..167].iter().all(|&v| v == 0.0), "{}", what("assign"));
        }
    }
}

/// The copy waits for the kernel that wrote its source, and a kernel on the destination
/// waits for the copy, with no host wait between them; copies both ways at once; a copy on a
/// stream of the destination that is not its default.
#[test]
fn copies_are_ordered_by_both_devices_streams() {
    let n = 1usize << 24;
    for (a, b) in mixed_pairs() {
        let what = format!("from {} to {}", a.name(), b.name());
        let ones = Tensor::ones([n], DType::F32, &a).unwrap();
        // Written by a kernel on `a` just before the copy reads it.
        let written = ones.mul(3.0).unwrap();
        written.realize().unwrap();
        // Read by a kernel on `b` right after the copy.
        let moved = written.to_device(&b);
        let later = moved
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .add(1.0)
            .unwrap();
        assert_eq!(
            later.sum(Axes::All, false).unwrap().item::<f32>().unwrap(),
            4.0 * n as f32,
            "{what}"
        );
        // Both ways at once.
        let there = Tensor::full([n], 5.0, DType::F32, &b)
            .unwrap()
            .mul(1.0)
            .unwrap();
        let (ab, ba) = (written.to_device(&b).unwrap(), there.to_device(&a).unwrap());
        assert_eq!(
            ab.max(Axes::All, false).unwrap().item::<f32>().unwrap(),
            3.0,
            "{what}"
        );
        assert_eq!(
            ba.min(Axes::All, false).unwrap().item::<f32>().unwrap(),
            5.0,
            "{what}"
        );
        // The source dropped right after the copy: its memory is not reused before the copy
        // has read it (the source's stream waits for the copy).
        let moved = Tensor::full([n], 7.0, DType::F32, &a)
            .unwrap()
            .to_device(&b)
            .unwrap();
        let reuse = Tensor::zeros([n], DType::F32, &a)
            .unwrap()
            .mul(2.0)
            .unwrap();
        reuse.realize().unwrap();
        assert_eq!(
            moved.min(Axes::All, false).unwrap().item::<f32>().unwrap(),
            7.0,
            "{what}"
        );
        drop(reuse);
        // Onto a stream of `b` that is not its default.
        let side = b.new_stream().unwrap();
        b.set_stream(&side).unwrap();
        let on_side = written.to_device(&b).unwrap().add(1.0).unwrap();
        b.set_stream(&b.default_stream()).unwrap();
        assert_eq!(
            on_side
                .sum(Axes::All, false)
                .unwrap()
                .item::<f32>()
                .unwrap(),
            4.0 * n as f32,
            "{what}"
        );
    }
}
