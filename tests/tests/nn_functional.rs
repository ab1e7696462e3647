//! Losses and the small functional ops of training (issue 40) on every device, against
//! their definitions computed here on the host (PyTorch's, from first principles), with
//! their gradients: mse_loss, nll_loss, cross_entropy (with label smoothing), one_hot,
//! embedding, dropout (the same mask as the CPU's for a seed).

use strata::nn::functional::{
    cross_entropy, dropout, embedding, mse_loss, nll_loss, one_hot, Reduction,
};
use strata::prelude::*;
use strata_tests::test_device;

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what} at {i}: {g} vs {w}"
        );
    }
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

fn losses(dev: &Device) -> Result<()> {
    let (n, c) = (5usize, 4usize);
    let raw: Vec<f64> = (0..n * c)
        .map(|i| ((i * 37) % 11) as f64 / 3.0 - 1.5)
        .collect();
    let classes: Vec<i64> = vec![3, 0, 2, 2, 1];
    let target = Tensor::from_slice(&classes, [n], dev)?;
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        // mse_loss and its gradient 2 (a - b) / n.
        let a = Tensor::from_slice(&raw, [n, c], dev)?
            .to_dtype(dtype)?
            .requires_grad_(true)?;
        let b = Tensor::from_slice(&raw, [n, c], dev)?
            .to_dtype(dtype)?
            .flip(&[0])?;
        let bv = values(&b)?;
        let sq: Vec<f64> = raw
            .iter()
            .zip(&bv)
            .map(|(x, y)| (x - y) * (x - y))
            .collect();
        let mean = sq.iter().sum::<f64>() / sq.len() as f64;
        let loss = mse_loss(&a, &b, Reduction::Mean)?;
        close(&values(&loss)?, &[mean], tol, "mse mean");
        close(
            &values(&mse_loss(&a, &b, Reduction::Sum)?)?,
            &[sq.iter().sum()],
            tol,
            "mse sum",
        );
        close(
            &values(&mse_loss(&a, &b, Reduction::None)?)?,
            &sq,
            tol,
            "mse none",
        );
        loss.backward()?;
        let want: Vec<f64> = raw
            .iter()
            .zip(&bv)
            .map(|(x, y)| 2.0 * (x - y) / (n * c) as f64)
            .collect();
        close(&values(&a.grad().unwrap())?, &want, tol, "mse gradient");

        // cross_entropy (= nll_loss of log_softmax) with label smoothing, and its gradient
        // (softmax - q) / n, q the smoothed target.
        for smoothing in [0.0, 0.1] {
            let logits = Tensor::from_slice(&raw, [n, c], dev)?
                .to_dtype(dtype)?
                .requires_grad_(true)?;
            let (mut per_row, mut grad) = (Vec::new(), Vec::new());
            for r in 0..n {
                let row = &raw[r * c..(r + 1) * c];
                let m = row.iter().cloned().fold(f64::MIN, f64::max);
                let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                let logp: Vec<f64> = row.iter().map(|x| x - lse).collect();
                let nll = -logp[classes[r] as usize];
                let uniform = -logp.iter().sum::<f64>() / c as f64;
                per_row.push((1.0 - smoothing) * nll + smoothing * uniform);
                for (k, lp) in logp.iter().enumerate() {
                    let q = (1.0 - smoothing) * f64::from(k == classes[r] as usize)
                        + smoothing / c as f64;
                    grad.push((lp.exp() - q) / n as f64);
                }
            }
            let what = format!("cross_entropy {dtype} smoothing {smoothing}");
            let loss = cross_entropy(&logits, &target, smoothing, Reduction::Mean)?;
            close(
                &values(&loss)?,
                &[per_row.iter().sum::<f64>() / n as f64],
                tol,
                &what,
            );
            let none = cross_entropy(&logits, &target, smoothing, Reduction::None)?;
            close(&values(&none)?, &per_row, tol, &what);
            loss.backward()?;
            close(
                &values(&logits.grad().unwrap())?,
                &grad,
                tol,
                &format!("{what} gradient"),
            );
            if smoothing == 0.0 {
                let nll = nll_loss(&logits.detach().log_softmax(-1)?, &target, Reduction::Sum)?;
                close(&values(&nll)?, &[per_row.iter().sum()], tol, "nll_loss sum");
            }
        }
        // One row, one class.
        let row = Tensor::from_slice(&raw[..c], [c], dev)?.to_dtype(dtype)?;
        let one = Tensor::scalar(2i64, dev)?;
        let logp = row.log_softmax(-1)?;
        let want = -values(&logp)?[2];
        close(
            &values(&nll_loss(&logp, &one, Reduction::Mean)?)?,
            &[want],
            tol,
            "nll [C]",
        );
        assert_eq!(
            nll_loss(&logp, &one, Reduction::None)?.shape(),
            &[] as &[usize]
        );
    }
    // Shapes and dtypes that do not fit are errors.
    let logits = Tensor::zeros([n, c], DType::F32, dev)?;
    assert!(cross_entropy(
        &logits,
        &Tensor::zeros([n + 1], DType::I64, dev)?,
        0.0,
        Reduction::Mean
    )
    .is_err());
    assert!(cross_entropy(
        &logits,
        &Tensor::zeros([n], DType::F32, dev)?,
        0.0,
        Reduction::Mean
    )
    .is_err());
    assert!(cross_entropy(&logits, &target, 1.5, Reduction::Mean).is_err());
    Ok(())
}

fn encodings(dev: &Device) -> Result<()> {
    // one_hot: i64 of shape [...indices, classes].
    let i = Tensor::from_slice(&[1i32, 0, 3, 3, 2, 0], [2, 3], dev)?;
    let h = one_hot(&i, 4)?;
    assert_eq!((h.shape(), h.dtype()), (&[2, 3, 4][..], DType::I64));
    let want: Vec<i64> = [1, 0, 3, 3, 2, 0]
        .iter()
        .flat_map(|&k| (0..4).map(move |c| i64::from(c == k)))
        .collect();
    assert_eq!(h.to_vec::<i64>()?, want);
    assert!(one_hot(&i, 3).is_err());
    assert!(one_hot(&Tensor::from_slice(&[-1i64], [1], dev)?, 3).is_err());
    assert!(one_hot(&Tensor::zeros([2], DType::F32, dev)?, 3).is_err());

    // embedding: rows of the weight, and a gradient that sums repeated indices.
    for dtype in [DType::F32, DType::F64] {
        let w = Tensor::arange(0.0, 12.0, 1.0, dtype, dev)?
            .reshape([4, 3])?
            .requires_grad_(true)?;
        let idx = Tensor::from_slice(&[3i64, 1, 3, 0], [2, 2], dev)?;
        let e = embedding(&idx, &w)?;
        assert_eq!(e.shape(), &[2, 2, 3]);
        let rows: Vec<f64> = [3, 1, 3, 0]
            .iter()
            .flat_map(|&r| (0..3).map(move |k| (3 * r + k) as f64))
            .collect();
        assert_eq!(values(&e)?, rows);
        e.sum(Axes::All, false)?.backward()?;
        let counts = [1.0, 1.0, 0.0, 2.0];
        let grad: Vec<f64> = counts.iter().flat_map(|&c| [c; 3]).collect();
        assert_eq!(
            values(&w.grad().unwrap())?,
            grad,
            "embedding gradient {dtype}"
        );
    }
    assert!(embedding(
        &Tensor::zeros([2], DType::F32, dev)?,
        &Tensor::zeros([3, 2], DType::F32, dev)?
    )
    .is_err());
    Ok(())
}

fn dropouts(dev: &Device) -> Result<()> {
    let n = 1 << 14;
    for (dtype, p) in [(DType::F32, 0.25), (DType::BF16, 0.5), (DType::F64, 0.9)] {
        let x = Tensor::full([n], 3.0, dtype, dev)?.requires_grad_(true)?;
        let y = dropout(&x, p, true, &mut Generator::new(11))?;
        let got = values(&y)?;
        // The same mask as the CPU's for the seed.
        let on_cpu = dropout(
            &Tensor::full([n], 3.0, dtype, &Device::cpu())?,
            p,
            true,
            &mut Generator::new(11),
        )?;
        assert_eq!(
            got,
            values(&on_cpu)?,
            "dropout {dtype} p={p}: the CPU's mask"
        );
        let scale = values(&Tensor::full([1], 3.0 / (1.0 - p), dtype, dev)?)?[0];
        assert!(
            got.iter().all(|&v| v == 0.0 || v == scale),
            "dropout {dtype} values"
        );
        let zeros = got.iter().filter(|&&v| v == 0.0).count() as f64 / n as f64;
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (zeros - p).abs() < 5.0 * sigma,
            "dropout {dtype} p={p}: {zeros} dropped"
        );
        // The gradient is the mask, scaled.
        y.sum(Axes::All, false)?.backward()?;
        let g = values(&x.grad().unwrap())?;
        let unit = values(&Tensor::full([1], 1.0 / (1.0 - p), dtype, dev)?)?[0];
        for (gv, yv) in g.iter().zip(&got) {
            assert_eq!(
                *gv,
                if *yv == 0.0 { 0.0 } else { unit },
                "dropout {dtype} gradient"
            );
        }
        let kept = dropout(&x, p, false, &mut Generator::new(11))?;
        assert_eq!(values(&kept)?, vec![3.0; n]);
    }
    let x = Tensor::ones([4], DType::F32, dev)?;
    assert!(dropout(&x, 1.5, true, &mut Generator::new(0)).is_err());
    assert!(dropout(
        &Tensor::ones([4], DType::I32, dev)?,
        0.5,
        true,
        &mut Generator::new(0)
    )
    .is_err());
    assert_eq!(
        dropout(&x, 1.0, true, &mut Generator::new(0))?.to_vec::<f32>()?,
        vec![0.0; 4]
    );
    Ok(())
}

test_device!(losses_and_their_gradients_match_their_definitions, losses);
test_device!(one_hot_and_embedding_with_gradients, encodings);
test_device!(dropout_masks_match_the_cpu_and_scale, dropouts);
