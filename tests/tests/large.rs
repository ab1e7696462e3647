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

/// Rows of this many i32 make a 4-row tensor just over 128 MiB (each row fits one binding).
const ROW: usize = (1 << 23) + 1025;

fn index_ops_above_the_binding_limit(dev: &Device) -> Result<()> {
    let host: Vec<i32> = (0..4 * ROW).map(|i| (i % 9973) as i32).collect();
    let big = Tensor::from_slice(&host, [4, ROW], dev)?;
    // A gather along the rows: each row of the output reads anywhere in its own row.
    let cols: Vec<i64> = vec![0, (ROW - 1) as i64, 12_345, -1, 7, ROW as i64 / 2];
    let index = Tensor::from_slice(
        &[&cols[..3], &cols[3..], &cols[..3], &cols[3..]].concat(),
        [4, 3],
        dev,
    )?;
    let want = |t: &[i32]| -> Vec<i32> {
        (0..4)
            .flat_map(|r| {
                let pick = if r % 2 == 0 { &cols[..3] } else { &cols[3..] };
                pick.iter()
                    .map(|&c| t[r * ROW + c.rem_euclid(ROW as i64) as usize])
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    assert_eq!(big.gather(1, &index)?.to_vec::<i32>()?, want(&host));
    // A scatter-add into the big tensor along its rows, read back through the same gather.
    let add = Tensor::from_slice(&(1..=12).collect::<Vec<i32>>(), [4, 3], dev)?;
    big.scatter_add_(1, &index, &add)?;
    let mut updated = host.clone();
    for r in 0..4 {
        let pick = if r % 2 == 0 { &cols[..3] } else { &cols[3..] };
        for (j, &c) in pick.iter().enumerate() {
            updated[r * ROW + c.rem_euclid(ROW as i64) as usize] += (3 * r + j + 1) as i32;
        }
    }
    assert_eq!(big.gather(1, &index)?.to_vec::<i32>()?, want(&updated));
    // A gather down the columns: every piece binds all four rows of its columns (96 MiB).
    let down = Tensor::from_slice(&[3i64, 0, 1, 2, 3, 0], [2, 3], dev)?;
    assert_eq!(
        big.gather(0, &down)?.to_vec::<i32>()?,
        vec![
            updated[3 * ROW],
            updated[1],
            updated[ROW + 2],
            updated[2 * ROW],
            updated[3 * ROW + 1],
            updated[2]
        ]
    );
    // Untouched neighbours stay as they were.
    let next = Tensor::from_slice(&[1i64, 1, 1, 1], [4, 1], dev)?;
    assert_eq!(
        big.gather(1, &next)?.to_vec::<i32>()?,
        (0..4).map(|r| host[r * ROW + 1]).collect::<Vec<_>>()
    );
    Ok(())
}
test_device!(
    index_ops_on_tensors_above_the_binding_limit,
    index_ops_above_the_binding_limit
);

/// Host↔device copies larger than the CUDA backend's pinned staging ring (four 16 MiB
/// chunks) and wgpu's (four 32 MiB chunks), of odd lengths so the last chunk is partial: every
/// byte arrives, in every direction, for 1-, 4-, 8-byte and bool elements.
fn large_copies(dev: &Device) -> Result<()> {
    let n = (70 << 20) + 3;
    let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8 ^ (i >> 20) as u8).collect();
    let t = Tensor::from_slice(&bytes, [n], dev)?;
    assert!(t.to_vec::<u8>()? == bytes, "u8 round trip");
    // A view read back through its contiguous copy.
    let tail = t.slice(s![n - 5..])?.to_vec::<u8>()?;
    assert_eq!(tail, bytes[n - 5..].to_vec());
    let m = (5 << 20) + 1;
    let wide: Vec<i64> = (0..m as i64).map(|i| i * 0x1_0000_0001 - 7).collect();
    assert!(
        Tensor::from_slice(&wide, [m], dev)?.to_vec::<i64>()? == wide,
        "i64 round trip"
    );
    let flags: Vec<bool> = (0..m).map(|i| i % 3 == 0).collect();
    assert!(
        Tensor::from_slice(&flags, [m], dev)?.to_vec::<bool>()? == flags,
        "bool round trip"
    );
    // Past four of wgpu's 32 MiB staging chunks in one copy: chunks are refilled within it.
    let k = (150 << 20) / 4 + 1;
    let floats: Vec<u32> = (0..k as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    assert!(
        Tensor::from_slice(&floats, [k], dev)?.to_vec::<u32>()? == floats,
        "u32 round trip of 150 MiB"
    );
    // Emptying the caches releases wgpu's staging chunks; the next large copy makes new ones.
    dev.empty_cache();
    assert!(
        Tensor::from_slice(&wide, [m], dev)?.to_vec::<i64>()? == wide,
        "i64 round trip after empty_cache"
    );
    Ok(())
}
test_device!(large_copies_round_trip_every_byte, large_copies);
