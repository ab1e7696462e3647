//! Bad input gives an `Err` whose message names the values involved, never a panic.

use strata::prelude::*;
use strata_tests::test_device;

/// Asserts `r` is an `Err` whose message contains every one of `needles`.
fn expect_err<T: std::fmt::Debug>(r: Result<T>, needles: &[&str]) {
    let msg = r.expect_err("expected an error").to_string();
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} does not name {n:?}");
    }
}

fn bad_inputs(dev: &Device) -> Result<()> {
    let t = Tensor::zeros([2, 3], DType::F32, dev)?;
    expect_err(t.slice(s![5]), &["index 5", "size 2"]);
    expect_err(t.slice(s![.., -4]), &["index -4", "size 3"]);
    expect_err(t.slice(s![..;0]), &["step", "0"]);
    expect_err(t.slice(s![0, 0, 0]), &["too many indices", "3", "[2, 3]"]);
    expect_err(t.slice(s![..., 0, ...]), &["ellipsis"]);
    expect_err(t.reshape([4, 2]), &["[2, 3]", "[4, 2]"]);
    expect_err(t.reshape([-1, -1]), &["-1"]);
    expect_err(t.reshape([4, -1]), &["[2, 3]", "[4, -1]"]);
    expect_err(t.t()?.view([6]), &["[3, 2]", "[1, 3]", "reshape"]);
    expect_err(t.permute([0, 0]), &["[0, 0]"]);
    expect_err(t.permute([1]), &["[1]"]);
    expect_err(t.permute([0, 2]), &["axis 2"]);
    expect_err(t.expand([4, 3]), &["[2, 3]", "[4, 3]"]);
    expect_err(t.transpose(0, 5), &["axis 5"]);
    expect_err(t.narrow(1, 2, 2), &["narrow", "size 3"]);
    expect_err(t.unsqueeze(4), &["axis 4"]);
    expect_err(
        Tensor::from_slice(&[1.0f32, 2.0, 3.0], [2, 2], dev),
        &["3 values", "[2, 2]"],
    );
    expect_err(
        Tensor::zeros([usize::MAX, 2], DType::U8, dev),
        &["overflows"],
    );
    expect_err(
        Tensor::zeros([1usize << 40, 1 << 40], DType::U8, dev),
        &["overflows"],
    );
    expect_err(Tensor::zeros([2, -3], DType::U8, dev), &["-3"]);
    expect_err(t.item::<f32>(), &["item", "[2, 3]", "6 elements"]);
    expect_err(t.to_vec::<f64>(), &["f32", "f64"]);
    expect_err(t.item::<i32>(), &["f32", "i32"]);
    expect_err(
        Tensor::arange(0, 10, -1, DType::I32, dev),
        &["arange", "-1"],
    );
    expect_err(Tensor::arange(0.0, 1.0, 0.0, DType::F32, dev), &["arange"]);
    expect_err(t.as_strided([3], [3], 0), &["outside"]);
    // Writing into a broadcast view would write one element several times.
    let b = Tensor::zeros([3], DType::F32, dev)?.expand([2, 3])?;
    expect_err(b.fill(1.0), &["overlap", "[2, 3]", "[0, 1]"]);
    expect_err(
        t.assign(&Tensor::zeros([4], DType::F32, dev)?),
        &["[4]", "[2, 3]"],
    );
    // Tensors on different devices do not mix (CPU devices do: they share host memory); a
    // copy is the exception (`assign`, PyTorch's `copy_`), broadcast as any assignment.
    let other = Tensor::full([3], 2.0, DType::F32, &strata_tests::stand_in_device())?;
    expect_err(t.add(&other), &["different devices", "stand-in"]);
    t.assign(&other)?;
    assert_eq!(t.to_vec::<f32>()?, vec![2.0; 6]);
    let host = Tensor::zeros([3], DType::F32, &Device::cpu())?;
    t.assign(&host)?;
    assert_eq!(t.to_vec::<f32>()?, vec![0.0; 6]);
    // Unknown devices and dtypes.
    expect_err(Device::parse("tpu:0"), &["tpu:0"]);
    expect_err("f8".parse::<DType>(), &["f8"]);
    // The device still works afterwards.
    assert_eq!(Tensor::ones([1], DType::I32, dev)?.item::<i32>()?, 1);
    Ok(())
}
test_device!(bad_input_is_an_error_naming_the_values, bad_inputs);

fn out_of_memory(dev: &Device) -> Result<()> {
    if dev.kind() == strata::BackendKind::Cpu {
        return Ok(()); // the host's overcommit policy decides there, not strata
    }
    let keep = Tensor::full([1000], 3.0, DType::F32, dev)?;
    // 4 TiB: more than any GPU has.
    let err = Tensor::empty([1usize << 42], DType::U8, dev).expect_err("4 TiB allocated");
    assert!(
        matches!(err, Error::OutOfMemory { requested, .. } if requested == 1 << 42),
        "{err}"
    );
    // The device keeps working, and earlier tensors keep their values.
    let sum = keep.sum(strata::ops::Axes::All, false)?.item::<f32>()?;
    assert_eq!(sum, 3000.0);
    assert_eq!((&keep * 2.0)?.slice(s![7])?.item::<f32>()?, 6.0);
    Ok(())
}
test_device!(
    out_of_memory_is_an_error_and_the_device_keeps_working,
    out_of_memory
);
