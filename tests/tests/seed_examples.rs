//! The examples from augpy's and SambaTensor's documentation, run as written.

use strata::prelude::*;
use strata_tests::test_device;

fn augpy_arithmetic(dev: &Device) -> Result<()> {
    let t = Tensor::zeros([2, 2, 4], DType::U8, dev)?;
    t.add_(3)?; // t += 3
    assert_eq!(t.to_vec::<u8>()?, vec![3; 16]);
    let r = (5 - &t)?;
    assert_eq!((r.dtype(), r.to_vec::<u8>()?), (DType::U8, vec![2; 16]));
    let gt = t.gt(&(&t - 1)?)?;
    assert_eq!(gt.to_vec::<bool>()?, vec![true; 16]);
    t.set(s![..], 40)?; // t[:] = 40
    let zero_minus = Tensor::scalar(0u8, dev)?.sub_sat(&t)?;
    assert_eq!(
        (zero_minus.shape(), zero_minus.to_vec::<u8>()?),
        (&[2, 2, 4][..], vec![0; 16])
    );
    assert_eq!(
        (0 - &t)?.to_vec::<u8>()?,
        vec![216; 16],
        "default arithmetic wraps"
    );
    assert_eq!(t.add_sat(250)?.to_vec::<u8>()?, vec![255; 16]);
    let t1 = Tensor::zeros([3, 1], DType::U8, dev)?;
    let t2 = Tensor::zeros([1, 3], DType::U8, dev)?;
    let p = ((&t1 + 3)? * (&t2 + 4)?)?;
    assert_eq!((p.shape(), p.to_vec::<u8>()?), (&[3, 3][..], vec![12; 9]));
    Ok(())
}
test_device!(augpy_examples, augpy_arithmetic);

fn operators(dev: &Device) -> Result<()> {
    let t = Tensor::from_slice(&[1.0f32, 2.0, 4.0], [3], dev)?;
    assert_eq!((1.0 - &t)?.to_vec::<f32>()?, vec![0.0, -1.0, -3.0]);
    assert_eq!((&t / 2.0)?.to_vec::<f32>()?, vec![0.5, 1.0, 2.0]);
    assert_eq!((8.0 / &t)?.to_vec::<f32>()?, vec![8.0, 4.0, 2.0]);
    assert_eq!((&t * &t)?.to_vec::<f32>()?, vec![1.0, 4.0, 16.0]);
    assert_eq!((-&t)?.to_vec::<f32>()?, vec![-1.0, -2.0, -4.0]);
    let i = Tensor::from_slice(&[-7i64, 7], [2], dev)?;
    assert_eq!((&i % 3)?.to_vec::<i64>()?, vec![2, 1]);
    assert_eq!((5 - &i)?.to_vec::<i64>()?, vec![12, -2]);
    // Chained with `?`, owned and borrowed operands mix.
    let chained = (((&t + 1.0)? * 2.0)? - t.clone())?;
    assert_eq!(chained.to_vec::<f32>()?, vec![3.0, 4.0, 6.0]);
    // Shapes that do not broadcast are an error naming both.
    let e = (&t + &Tensor::zeros([2], DType::F32, dev)?).unwrap_err();
    assert!(
        e.to_string().contains("[3]") && e.to_string().contains("[2]"),
        "{e}"
    );
    Ok(())
}
test_device!(operators_with_scalars_on_either_side, operators);

fn in_place_and_out(dev: &Device) -> Result<()> {
    let base = Tensor::zeros([2, 3], DType::I32, dev)?;
    let col = base.slice(s![.., 1])?;
    col.add_(Tensor::from_slice(&[5i32, 6], [2], dev)?)?; // through a view into the base
    assert_eq!(base.to_vec::<i32>()?, vec![0, 5, 0, 0, 6, 0]);
    base.mul_(2)?;
    assert_eq!(base.to_vec::<i32>()?, vec![0, 10, 0, 0, 12, 0]);
    // In place keeps the dtype: a float result cannot go into an integer tensor.
    let e = base.div_(2).unwrap_err();
    assert!(
        e.to_string().contains("f32") && e.to_string().contains("i32"),
        "{e}"
    );
    // The broadcast shape must be self's shape.
    assert!(col.add_(&base).is_err());
    // `out` forms check shape and dtype, and write through views.
    let out = Tensor::zeros([2, 3], DType::F64, dev)?;
    base.add_out(0.5, &out)?;
    assert_eq!(out.to_vec::<f64>()?, vec![0.5, 10.5, 0.5, 0.5, 12.5, 0.5]);
    let e = base
        .add_out(1, &Tensor::zeros([3, 2], DType::I32, dev)?)
        .unwrap_err();
    assert!(
        e.to_string().contains("[3, 2]") && e.to_string().contains("[2, 3]"),
        "{e}"
    );
    let e = base
        .sqrt_out(&Tensor::zeros([2, 3], DType::I32, dev)?)
        .unwrap_err();
    assert!(
        e.to_string().contains("f32") && e.to_string().contains("i32"),
        "{e}"
    );
    let e = base
        .add_out(
            1,
            &Tensor::zeros([2, 3], DType::I32, &strata_tests::stand_in_device())?,
        )
        .unwrap_err();
    assert!(e.to_string().contains("different devices"), "{e}");
    Ok(())
}
test_device!(in_place_and_out_forms, in_place_and_out);

fn ternary(dev: &Device) -> Result<()> {
    let x = Tensor::from_slice(&[-2.0f32, 0.5, 3.0, f32::NAN], [4], dev)?;
    let w = Tensor::where_cond(&x.gt(0.0)?, &x, -1)?;
    assert_eq!(w.to_vec::<f32>()?[..3], [-1.0, 0.5, 3.0]);
    let c = x.clamp(-1.0, 1.0)?.to_vec::<f32>()?;
    assert_eq!(c[..3], [-1.0, 0.5, 1.0]);
    assert!(c[3].is_nan());
    let lo = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 0.0], [4], dev)?;
    assert_eq!(x.clamp(&lo, 2.5)?.to_vec::<f32>()?[..3], [0.0, 1.0, 2.5]);
    let f = Tensor::from_slice(&[0.1f32], [1], dev)?.fma(10.0f32, -1.0f32)?;
    assert_eq!(f.item::<f32>()?, 0.1f32.mul_add(10.0, -1.0));
    let l = Tensor::from_slice(&[0.0f64, 10.0], [2], dev)?
        .lerp(20.0, Tensor::from_slice(&[0.25f64, 0.75], [2], dev)?)?;
    assert_eq!(l.to_vec::<f64>()?, vec![5.0, 17.5]);
    assert!(Tensor::where_cond(&x, &x, 0.0)
        .unwrap_err()
        .to_string()
        .contains("bool"));
    assert!(Tensor::zeros([1], DType::I32, dev)?.lerp(1, 2).is_err());
    Ok(())
}
test_device!(where_clamp_fma_lerp, ternary);

/// Elementwise results keep the memory order of a dense input (as PyTorch), and values
/// are unaffected by the order kernels visit elements in.
fn memory_order(dev: &Device) -> Result<()> {
    let x = Tensor::arange(0, 6, 1, DType::I32, dev)?
        .reshape([2, 3])?
        .t()?;
    let r = (&x + 10)?;
    assert_eq!((r.shape(), r.strides()), (x.shape(), x.strides()));
    assert_eq!(r.to_vec::<i32>()?, vec![10, 13, 11, 14, 12, 15]);
    let p = Tensor::arange(0, 24, 1, DType::F32, dev)?
        .reshape([2, 3, 4])?
        .permute([2, 0, 1])?;
    let q = p.exp()?.log()?;
    assert_eq!(q.strides(), p.strides());
    let (a, b) = (q.to_vec::<f32>()?, p.to_vec::<f32>()?);
    assert!(a.iter().zip(&b).all(|(u, v)| (u - v).abs() < 1e-4));
    // Contiguous and broadcast inputs still give row-major results; copies are contiguous.
    assert!((&x.contiguous()? * 2)?.is_contiguous());
    assert!(x.copy()?.is_contiguous() && x.contiguous()?.is_contiguous());
    Ok(())
}
test_device!(elementwise_results_keep_memory_order, memory_order);

/// A transposed operand beside a row-major one, large enough for GPU backends' tiled path
/// (edges that are not multiples of 32 included), in every width; first as a dense transposed
/// view (the result then takes its memory order, so the row-major input is the one read down
/// the columns), then as a transposed slice (not dense: the result stays row-major).
fn transposed_beside_row_major(dev: &Device) -> Result<()> {
    let (rows, cols) = (45usize, 70usize);
    for dtype in [
        DType::U8,
        DType::I16,
        DType::F16,
        DType::F32,
        DType::I32,
        DType::U32,
        DType::F64,
        DType::I64,
    ] {
        let a = Tensor::arange(0, (rows * cols) as i64, 1, DType::I64, dev)?
            .remainder(97i64)?
            .to_dtype(dtype)?
            .reshape([cols, rows])?
            .t()?;
        let b = Tensor::arange(0, (rows * cols) as i64, 1, DType::I64, dev)?
            .remainder(13i64)?
            .to_dtype(dtype)?
            .reshape([rows, cols])?;
        let got = (&a + &b)?.to_dtype(DType::I64)?.to_vec::<i64>()?;
        for r in 0..rows {
            for c in 0..cols {
                let want = ((c * rows + r) % 97 + (r * cols + c) % 13) as i64;
                assert_eq!(got[r * cols + c], want, "{dtype} at ({r}, {c})");
            }
        }
        let sliced = Tensor::arange(0, (cols * (rows + 3)) as i64, 1, DType::I64, dev)?
            .remainder(89i64)?
            .to_dtype(dtype)?
            .reshape([cols, rows + 3])?
            .slice(s![.., ..rows])?
            .t()?;
        let got = (&sliced + &b)?.to_dtype(DType::I64)?.to_vec::<i64>()?;
        for r in 0..rows {
            for c in 0..cols {
                let want = ((c * (rows + 3) + r) % 89 + (r * cols + c) % 13) as i64;
                assert_eq!(got[r * cols + c], want, "{dtype} sliced at ({r}, {c})");
            }
        }
    }
    Ok(())
}
test_device!(
    transposed_operands_beside_row_major_ones,
    transposed_beside_row_major
);
