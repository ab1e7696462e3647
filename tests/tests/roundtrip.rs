//! Host round trips: `from_slice` → `to_vec` for every dtype, and ndarray in and out with
//! non-contiguous inputs, on every device.

use half::{bf16, f16};
use ndarray::{s as nd_s, Array3, ArrayD};
use strata::prelude::*;
use strata::Element;
use strata_tests::test_device;

fn round_trip<T: Element>(values: &[T], dev: &Device) -> Result<()> {
    let t = Tensor::from_slice(values, [values.len()], dev)?;
    assert_eq!(t.dtype(), T::DTYPE);
    assert_eq!(t.to_vec::<T>()?, values, "{}", T::DTYPE);
    // And through a reversed, strided view.
    let rev: Vec<T> = values.iter().rev().copied().collect();
    assert_eq!(t.slice(s![..;-1])?.to_vec::<T>()?, rev);
    Ok(())
}

fn every_dtype(dev: &Device) -> Result<()> {
    round_trip(&[true, false, true], dev)?;
    round_trip(&[0u8, 1, 254, 255], dev)?;
    round_trip(&[0u16, 1, 65535], dev)?;
    round_trip(&[0u32, 7, u32::MAX], dev)?;
    round_trip(&[0u64, 7, u64::MAX], dev)?;
    round_trip(&[i8::MIN, -1, 0, i8::MAX], dev)?;
    round_trip(&[i16::MIN, -1, 0, i16::MAX], dev)?;
    round_trip(&[i32::MIN, -1, 0, i32::MAX], dev)?;
    round_trip(&[i64::MIN, -1, 0, i64::MAX], dev)?;
    round_trip(
        &[f16::from_f32(-1.5), f16::MAX, f16::MIN_POSITIVE_SUBNORMAL],
        dev,
    )?;
    round_trip(
        &[bf16::from_f32(-1.5), bf16::MAX, bf16::from_f32(3.0e-39)],
        dev,
    )?;
    round_trip(&[-1.5f32, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY], dev)?;
    round_trip(&[-1.5f64, f64::MAX, 1e-310, f64::NEG_INFINITY], dev)?;
    // NaN bit patterns survive (compared bitwise, since NaN != NaN).
    let t = Tensor::from_slice(&[f32::NAN], [1], dev)?;
    assert!(t.to_vec::<f32>()?[0].is_nan());
    Ok(())
}
test_device!(from_slice_to_vec_every_dtype, every_dtype);

fn ndarray_round_trip(dev: &Device) -> Result<()> {
    let a = Array3::from_shape_fn((3, 4, 5), |(i, j, k)| (i * 100 + j * 10 + k) as i32);
    // Non-contiguous inputs: transposed, stepped, reversed.
    let views: Vec<ArrayD<i32>> = vec![
        a.clone().into_dyn(),
        a.t().to_owned().into_dyn(),
        a.slice(nd_s![.., 1..;2, ..;-1]).into_owned().into_dyn(),
    ];
    for expected in views {
        let t = Tensor::from_ndarray(&expected, dev)?;
        assert_eq!(t.to_ndarray::<i32>()?, expected);
    }
    let p = a.view().permuted_axes([2, 0, 1]);
    let t = Tensor::from_ndarray(&p, dev)?;
    assert_eq!(t.shape(), &[5, 3, 4]);
    assert_eq!(t.to_ndarray::<i32>()?, p.to_owned().into_dyn());
    // And out of a strata view.
    let base = Tensor::from_ndarray(&a, dev)?;
    let view = base.slice(s![.., ..;-2, 1..4])?;
    let expected = a.slice(nd_s![.., ..;-2, 1..4]).to_owned().into_dyn();
    assert_eq!(view.to_ndarray::<i32>()?, expected);
    Ok(())
}
test_device!(from_ndarray_to_ndarray_non_contiguous, ndarray_round_trip);

fn to_device_between_devices(dev: &Device) -> Result<()> {
    let cpu = Device::cpu();
    let t = Tensor::arange(0, 6, 1, DType::U16, dev)?
        .reshape([2, 3])?
        .t()?;
    let there = t.to_device(&cpu)?;
    let back = there.to_device(dev)?;
    assert_eq!(back.to_vec::<u16>()?, vec![0, 3, 1, 4, 2, 5]);
    assert_eq!(back.device(), dev);
    Ok(())
}
test_device!(to_device_round_trip, to_device_between_devices);
