//! Index ops against plain-Rust references, the SambaTensor examples, and their errors.

use strata::prelude::*;
use strata_tests::test_device;

fn ints(t: &Tensor) -> Result<Vec<i64>> {
    t.to_dtype(DType::I64)?.to_vec::<i64>()
}

/// A [3, 4] source of `dtype` in several layouts, with its logical values.
fn sources(dtype: DType, dev: &Device) -> Result<Vec<(&'static str, Tensor)>> {
    let base = Tensor::arange(0, 12, 1, DType::I64, dev)?.to_dtype(dtype)?;
    Ok(vec![
        ("contiguous", base.reshape([3, 4])?),
        (
            "transposed",
            base.reshape([4, 3])?.t()?.contiguous()?.t()?.t()?,
        ),
        (
            "negative-stride",
            base.reshape([3, 4])?.slice(s![..;-1, ..])?,
        ),
        (
            "offset",
            Tensor::arange(0, 20, 1, DType::I64, dev)?
                .to_dtype(dtype)?
                .reshape([4, 5])?
                .slice(s![1.., 1..])?,
        ),
    ])
}

fn index_ops(dev: &Device) -> Result<()> {
    for dtype in [
        DType::U8,
        DType::I32,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::Bool,
    ] {
        for (layout, src) in sources(dtype, dev)? {
            let ctx = format!("{dtype} ({layout})");
            let h = ints(&src)?; // row-major [3, 4]
            let at = |r: usize, c: usize| h[r * 4 + c];
            // gather along 1 and 0, with negative indices.
            let gi = Tensor::from_slice(&[3i64, -4, 1, 2, 0, -1], [3, 2], dev)?;
            let g = src.gather(1, &gi)?;
            let want: Vec<i64> = (0..3)
                .flat_map(|r| [[3usize, 0], [1, 2], [0, 3]][r].map(|c| at(r, c)))
                .collect();
            assert_eq!(ints(&g)?, want, "gather 1 {ctx}");
            let g0 = src.gather(0, &Tensor::from_slice(&[2i32, 0, 1, 2], [1, 4], dev)?)?;
            assert_eq!(
                ints(&g0)?,
                vec![at(2, 0), at(0, 1), at(1, 2), at(2, 3)],
                "gather 0 {ctx}"
            );
            // index_select with a reversed (negative-stride) index.
            let idx = Tensor::from_slice(&[0i64, 2, 3], [3], dev)?.slice(s![..;-1])?;
            let sel = src.index_select(1, &idx)?;
            let want: Vec<i64> = (0..3).flat_map(|r| [3, 2, 0].map(|c| at(r, c))).collect();
            assert_eq!(
                (sel.shape(), ints(&sel)?),
                (&[3, 3][..], want),
                "index_select {ctx}"
            );
            // take in the index's shape.
            let tk = src.take(&Tensor::from_slice(&[11i64, 0, -1, 5], [2, 2], dev)?)?;
            assert_eq!(ints(&tk)?, vec![h[11], h[0], h[11], h[5]], "take {ctx}");
            // masked_select / masked_fill with a broadcast mask.
            let mask = Tensor::from_slice(&[true, false, false, true], [4], dev)?;
            let ms = src.masked_select(&mask)?;
            let want: Vec<i64> = (0..3).flat_map(|r| [at(r, 0), at(r, 3)]).collect();
            assert_eq!(ints(&ms)?, want, "masked_select {ctx}");
            let mf = src.masked_fill(&mask, 1)?;
            let want: Vec<i64> = (0..12)
                .map(|i| if i % 4 == 0 || i % 4 == 3 { 1 } else { h[i] })
                .collect();
            assert_eq!(ints(&mf)?, want, "masked_fill {ctx}");
            assert_eq!(ints(&src)?, h, "masked_fill leaves the source alone {ctx}");
            // scatter into a copy; scatter_ through the view into its base.
            let si = Tensor::from_slice(&[2i64, 0, 1, 2], [1, 4], dev)?;
            let sc = src.scatter(0, &si, 1)?;
            let mut want = h.clone();
            for (c, r) in [2usize, 0, 1, 2].into_iter().enumerate() {
                want[r * 4 + c] = 1;
            }
            assert_eq!(ints(&sc)?, want, "scatter {ctx}");
        }
    }
    // Zero-size and 0-d operands.
    let empty = Tensor::zeros([2, 0], DType::F32, dev)?;
    let none = Tensor::zeros([0], DType::I64, dev)?;
    assert_eq!(empty.index_select(1, &none)?.shape(), &[2, 0]);
    assert_eq!(
        Tensor::arange(0, 3, 1, DType::I32, dev)?
            .index_select(0, &none)?
            .shape(),
        &[0]
    );
    let scalar_idx = Tensor::scalar(2i64, dev)?;
    assert_eq!(
        Tensor::arange(5, 8, 1, DType::U16, dev)?
            .take(&scalar_idx)?
            .item::<u16>()?,
        7
    );
    // scatter_add accumulates repeated indices; index_put_ with accumulate too.
    let z = Tensor::zeros([5], DType::I32, dev)?;
    let i = Tensor::from_slice(&[1i64, 3, 1, 1, -1], [5], dev)?;
    let v = Tensor::from_slice(&[1i32, 2, 3, 4, 5], [5], dev)?;
    assert_eq!(
        z.scatter_add(0, &i, &v)?.to_vec::<i32>()?,
        vec![0, 8, 0, 2, 5]
    );
    let base = Tensor::zeros([2, 3], DType::F32, dev)?;
    base.index_put_(1, &Tensor::from_slice(&[2i64, 2], [2], dev)?, 1.5, true)?;
    assert_eq!(base.to_vec::<f32>()?, vec![0.0, 0.0, 3.0, 0.0, 0.0, 3.0]);
    // Scatter through a view writes the base storage.
    let b2 = Tensor::zeros([3, 3], DType::I64, dev)?;
    b2.slice(s![1])?
        .scatter_(0, &Tensor::from_slice(&[2i64], [1], dev)?, 7)?;
    assert_eq!(b2.to_vec::<i64>()?, vec![0, 0, 0, 0, 0, 7, 0, 0, 0]);
    // one_hot.
    let oh = Tensor::from_slice(&[1i32, 0, 2], [3], dev)?.one_hot(None)?;
    assert_eq!(
        (oh.shape(), oh.to_vec::<i64>()?),
        (&[3, 3][..], vec![0, 1, 0, 1, 0, 0, 0, 0, 1])
    );
    Ok(())
}
test_device!(index_ops_against_references, index_ops);

/// SambaTensor's documented examples.
fn samba(dev: &Device) -> Result<()> {
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], dev)?;
    assert_eq!(t.slice(s![.., 2])?.to_vec::<f32>()?, vec![3.0, 6.0]);
    let idx = Tensor::from_slice(&[0i64, 2], [2], dev)?;
    let r = t.slice(s![NewAxis, .., &idx])?;
    assert_eq!(
        (r.shape(), r.to_vec::<f32>()?),
        (&[1, 2, 2][..], vec![1.0, 3.0, 4.0, 6.0])
    );
    t.set(s![.., 2], &Tensor::ones([2], DType::F32, dev)?)?;
    assert_eq!(t.to_vec::<f32>()?, vec![1.0, 2.0, 1.0, 4.0, 5.0, 1.0]);
    let twos = (Tensor::ones([1, 2, 2], DType::F32, dev)? * 2.0)?;
    t.set(s![NewAxis, .., &idx], &twos)?;
    assert_eq!(t.to_vec::<f32>()?, vec![2.0, 2.0, 2.0, 2.0, 5.0, 2.0]);
    // A 2-D index tensor replaces its axis with two.
    let i2 = Tensor::from_slice(&[1i64, 0, 0, 1], [2, 2], dev)?;
    assert_eq!(t.slice(s![&i2, 1])?.shape(), &[2, 2]);
    Ok(())
}
test_device!(sambatensor_examples, samba);

fn errors(dev: &Device) -> Result<()> {
    let t = Tensor::zeros([2, 3], DType::F32, dev)?;
    // An error at the op, or (a gather on a GPU) at the device's next synchronize.
    let msg = |r: Result<Tensor>| match r {
        Err(e) => e.to_string(),
        Ok(_) => dev.synchronize().unwrap_err().to_string(),
    };
    let e = msg(t.index_select(1, &Tensor::from_slice(&[0.0f32], [1], dev)?));
    assert!(e.contains("i32 or i64") && e.contains("f32"), "{e}");
    let e = msg(t.index_select(1, &Tensor::from_slice(&[3i64], [1], dev)?));
    assert!(e.contains("index 3") && e.contains("size 3"), "{e}");
    let e = msg(t.take(&Tensor::from_slice(&[-7i64], [1], dev)?));
    assert!(e.contains("index -7") && e.contains("size 6"), "{e}");
    let e = msg(t.gather(0, &Tensor::from_slice(&[2i64, 0, 0], [1, 3], dev)?));
    assert!(e.contains("index 2") && e.contains("size 2"), "{e}");
    let e = msg(t.gather(0, &Tensor::from_slice(&[0i64; 4], [1, 4], dev)?));
    assert!(e.contains("[1, 4]") && e.contains("[2, 3]"), "{e}");
    let e = msg(t.scatter(1, &Tensor::from_slice(&[5i64], [1, 1], dev)?, 1.0));
    assert!(e.contains("index 5"), "{e}");
    let e = msg(t.masked_fill(&Tensor::from_slice(&[true, false], [2], dev)?, 1.0));
    assert!(e.contains("[2]") && e.contains("[2, 3]"), "{e}");
    let e = msg(t.masked_select(&Tensor::zeros([2, 3], DType::U8, dev)?));
    assert!(e.contains("bool") && e.contains("u8"), "{e}");
    let e = msg(t.slice(s![
        &Tensor::from_slice(&[0i64], [1], dev)?,
        &Tensor::from_slice(&[0i64], [1], dev)?
    ]));
    assert!(e.contains("one index tensor"), "{e}");
    let e = msg(Tensor::from_slice(&[3i64], [1], dev)?.one_hot(Some(2)));
    assert!(e.contains("class 3"), "{e}");
    let ti = Tensor::zeros([2, 3], DType::I32, dev)?;
    let e = msg(ti.scatter(
        1,
        &Tensor::from_slice(&[0i64], [1, 1], dev)?,
        &Tensor::ones([1, 1], DType::F64, dev)?,
    ));
    assert!(e.contains("f64") && e.contains("i32"), "{e}");
    // Gathers check inside their kernel: one bad value among many, through the row path
    // (whole rows of a matrix), the element path, and an i32 index; and with nothing to
    // gather, the index itself.
    let m = Tensor::zeros([9, 12], DType::F32, dev)?;
    let mut rows = vec![0i64; 40];
    rows[17] = -10;
    let e = msg(m.index_select(0, &Tensor::from_slice(&rows, [40], dev)?));
    assert!(e.contains("index -10") && e.contains("size 9"), "{e}");
    let wide_rows = Tensor::zeros([9, 4096], DType::F32, dev)?;
    let e = msg(wide_rows.index_select(0, &Tensor::from_slice(&rows, [40], dev)?));
    assert!(e.contains("index -10") && e.contains("size 9"), "{e}");
    let mut flat: Vec<i32> = (0..1000).map(|i| i % 108 - 54).collect();
    flat[999] = 108;
    let e = msg(m.take(&Tensor::from_slice(&flat, [10, 100], dev)?));
    assert!(e.contains("index 108") && e.contains("size 108"), "{e}");
    let e = msg(Tensor::zeros([0, 3], DType::F32, dev)?
        .index_select(1, &Tensor::from_slice(&[3i64], [1], dev)?));
    assert!(e.contains("index 3") && e.contains("size 3"), "{e}");
    // The device still works.
    assert_eq!(t.sum(ops_all(), false)?.item::<f32>()?, 0.0);
    flat[999] = -108;
    let got = m.take(&Tensor::from_slice(&flat, [10, 100], dev)?)?;
    assert_eq!(got.shape(), &[10, 100]);
    Ok(())
}
fn ops_all() -> strata::ops::Axes {
    strata::ops::Axes::All
}
test_device!(index_errors_name_the_values, errors);

/// A gather's range check on a GPU is read at the device's next read or synchronize, not at
/// the op (no host wait mid-step); the CPU reports it at the op. Either way the error names
/// the value and the op, whatever is read next; once reported it is gone, and the device and
/// other tensors keep working. Its backward (a scatter-add) does not check again, and cannot
/// write outside the gradient.
fn gather_range_check(dev: &Device) -> Result<()> {
    let src = Tensor::arange(0, 6, 1, DType::F32, dev)?.reshape([2, 3])?;
    let bad = Tensor::from_slice(&[0i64, 7], [1, 2], dev)?;
    let other = Tensor::full([2], 5.0, DType::F32, dev)?;
    let at_op = dev.kind() == strata::BackendKind::Cpu || dev.blocking();
    match src.gather(1, &bad) {
        Err(e) => assert!(at_op, "{e}"),
        Ok(_) => {
            assert!(!at_op);
            // An unrelated read reports it, naming the op, the value and the caller's file.
            let e = other.to_vec::<f32>().unwrap_err();
            assert!(matches!(e, Error::Index(_)), "{e}");
            let m = e.to_string();
            assert!(m.contains("index 7") && m.contains("size 3"), "{m}");
            assert!(
                m.contains("gather called at") && m.contains("index_ops.rs"),
                "{m}"
            );
        }
    }
    // Reported once: the next read succeeds.
    assert_eq!(other.to_vec::<f32>()?, vec![5.0, 5.0]);
    // The backward of a gather with a bad index adds nothing outside the gradient.
    let w = Tensor::ones([2, 3], DType::F32, dev)?.requires_grad_(true)?;
    let good = Tensor::from_slice(&[2i64, -1, 0, 1], [2, 2], dev)?;
    let picked = w.gather(1, &good)?;
    picked.sum(strata::ops::Axes::All, false)?.backward()?;
    let g = w.grad().expect("a gradient");
    assert_eq!(g.to_vec::<f32>()?, vec![0.0, 0.0, 2.0, 1.0, 1.0, 0.0]);
    w.zero_grad();
    let bad = Tensor::from_slice(&[2i64, 9, 0, 1], [2, 2], dev)?;
    // (The backward starts from ones, not from a sum of `p`: `p`'s element where the index was
    // bad is memory no kernel wrote, which compute-sanitizer's initcheck would flag.)
    let r = w.gather(1, &bad).and_then(|p| {
        p.backward_with(&Tensor::ones([2, 2], DType::F32, dev)?)?;
        dev.synchronize().map(|_| p)
    });
    let e = r.map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("index 9") && e.contains("size 3"), "{e}");
    let g = w.grad().map(|g| g.to_vec::<f32>()).transpose()?;
    let sum: f32 = g.unwrap_or_default().iter().sum();
    assert!(sum <= 4.0, "the clamped backward wrote {sum} in all");
    // index_select and take report their value too.
    let e = match src.index_select(0, &Tensor::from_slice(&[0i64, -3], [2], dev)?) {
        Err(e) => e,
        Ok(_) => dev.synchronize().unwrap_err(),
    };
    assert!(
        e.to_string().contains("index -3") && e.to_string().contains("size 2"),
        "{e}"
    );
    assert_eq!(src.sum(strata::ops::Axes::All, false)?.item::<f32>()?, 15.0);
    Ok(())
}
test_device!(gather_range_reported_at_next_read, gather_range_check);

/// `index_select` on layouts that take the row path of a gather (whole runs after the indexed
/// axis, moved in vectors of 16, 8, 4 or 2 bytes on CUDA, of four elements on wgpu) and layouts that do not (misaligned runs, a
/// flipped or transposed source, runs shorter than 4), checked element by element against
/// the host. Indices repeat and count from the end.
fn index_select_rows(dev: &Device) -> Result<()> {
    // The last case has long runs (2,048 elements).
    let cases: [(&[usize], usize); 6] = [
        (&[9, 12], 0),
        (&[3, 5, 8], 1),
        (&[4, 6, 2, 3], 1),
        (&[2, 3, 5, 4], 2),
        (&[7, 3], 0),
        (&[6, 2048], 0),
    ];
    for dtype in [DType::F32, DType::F16, DType::U8, DType::I64, DType::Bool] {
        for &(shape, axis) in &cases {
            let numel: usize = shape.iter().product();
            let base = Tensor::arange(0, numel as i64, 1, DType::I64, dev)?
                .remainder(251)?
                .to_dtype(dtype)?
                .reshape(shape)?;
            let n = shape[axis] as i64;
            let picks = [n - 1, 0, -1, 1 % n, -n, n - 1];
            let index = Tensor::from_slice(&picks, [picks.len()], dev)?;
            // Views: the tensor itself, its runs one element off a vector, a flipped source.
            let last = shape.len() - 1;
            let mut views = vec![("whole", base.clone())];
            if axis < last && shape[last] > 1 {
                views.push(("narrowed", base.narrow(last as isize, 1, shape[last] - 1)?));
            }
            views.push(("flipped", base.flip(&[axis as isize])?));
            for (what, src) in views {
                let got = src.index_select(axis as isize, &index)?;
                let host = src.to_dtype(DType::I64)?.to_vec::<i64>()?;
                let dims = src.shape().to_vec();
                let mut want_shape = dims.clone();
                want_shape[axis] = picks.len();
                let want: Vec<i64> = strata_tests::indices(&want_shape)
                    .iter()
                    .map(|ix| {
                        let mut at = ix.clone();
                        at[axis] = picks[ix[axis]].rem_euclid(n) as usize;
                        let flat = at.iter().zip(&dims).fold(0, |acc, (&i, &d)| acc * d + i);
                        host[flat]
                    })
                    .collect();
                assert_eq!(got.shape(), &want_shape[..]);
                assert_eq!(
                    got.to_dtype(DType::I64)?.to_vec::<i64>()?,
                    want,
                    "{dtype} {shape:?} axis {axis} ({what})"
                );
            }
        }
    }
    Ok(())
}
test_device!(index_select_moves_whole_runs, index_select_rows);
