//! Tensors larger than one storage binding (128 MiB on lavapipe): the wgpu backend splits maps
//! and reductions into windows; every backend must give the CPU's results.

use strata::ops::Axes;
use strata::prelude::*;
use strata_tests::test_device;

/// Just over 128 MiB of f32, and an odd length so the last window is partial.
const N: usize = (1 << 25) + 4099;

fn above_the_binding_limit(dev: &Device) -> Result<()> {
    let cpu = Device::cpu();
    let host: Vec<f32> = (0..N).map(|i| (i % 1000) as f32 - 500.0).collect();
    let a = Tensor::from_slice(&host, [N], dev)?;
    // A map over every element, with a broadcast scalar and a reversed view.
    let got = ((&a * 2.0)? + &a.slice(s![..;-1])?)?;
    let want = {
        let c = Tensor::from_slice(&host, [N], &cpu)?;
        ((&c * 2.0)? + &c.slice(s![..;-1])?)?
    };
    assert_eq!(got.to_vec::<f32>()?, want.to_vec::<f32>()?);
    // A full sum (integers: exact) and an argmax whose winner sits in the last window.
    let ints = a.to_dtype(DType::I32)?;
    let total: i64 = host.iter().map(|&v| v as i64).sum();
    assert_eq!(ints.sum(Axes::All, false)?.item::<i64>()?, total);
    ints.slice(s![N - 3])?.fill(10_000)?;
    assert_eq!(ints.argmax(None, false)?.item::<i64>()?, (N - 3) as i64);
    // Sums along rows of ~32 MiB each, of a view that as a whole exceeds a binding.
    let rows = ints.slice(s![..N - 3])?.reshape([4, (N - 3) / 4])?;
    let want_rows: Vec<i64> = host[..N - 3]
        .chunks((N - 3) / 4)
        .map(|r| r.iter().map(|&v| v as i64).sum())
        .collect();
    assert_eq!(rows.sum(1, false)?.to_vec::<i64>()?, want_rows);
    Ok(())
}
test_device!(tensors_above_the_binding_limit, above_the_binding_limit);
