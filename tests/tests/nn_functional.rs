//! Losses and the functional ops of training (issue 40) on every device, against their
//! definitions computed here on the host (PyTorch's, from first principles), with their
//! gradients: mse_loss, nll_loss, cross_entropy (with label smoothing), one_hot, embedding,
//! dropout (the same mask as the CPU's for a seed), and linear, layer_norm, group_norm and
//! batch_norm (gradients checked against f64 finite differences).

use strata::nn::functional::{
    adaptive_avg_pool2d, avg_pool2d, batch_norm, conv2d, conv_transpose2d, cross_entropy,
    cross_entropy_with, dropout, embedding, group_norm, layer_norm, linear, max_pool2d, mse_loss,
    nll_loss, nll_loss_with, one_hot, ClassLoss, Reduction, RunningStats,
};
use strata::prelude::*;
use strata::RecordKind;
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
/// Class weights and an ignored class (PyTorch's `weight=` and `ignore_index=`), alone, together
/// and with label smoothing, every reduction: against the definitions on the host, and the
/// gradients against finite differences.
fn weighted_losses(dev: &Device) -> Result<()> {
    let (n, c) = (6usize, 3usize);
    let raw: Vec<f64> = (0..n * c)
        .map(|i| ((i * 29) % 13) as f64 / 4.0 - 1.5)
        .collect();
    let classes: Vec<i64> = vec![2, -100, 0, 1, 2, -100];
    let weight_values = [0.5f64, 2.0, 1.25];
    let target = Tensor::from_slice(&classes, [n], dev)?;
    let weight = Tensor::from_slice(&weight_values, [c], dev)?;
    for (weighted, ignore, eps) in [
        (true, false, 0.0),
        (false, true, 0.0),
        (true, true, 0.0),
        (true, true, 0.2),
        (false, true, 0.3),
    ] {
        // With no ignored class the -100 rows would be out of range: those cases use class 1.
        let rows: Vec<i64> = classes
            .iter()
            .map(|&t| if t < 0 && !ignore { 1 } else { t })
            .collect();
        let target = if ignore {
            target.clone()
        } else {
            Tensor::from_slice(&rows, [n], dev)?
        };
        let (mut per_row, mut divisor) = (Vec::new(), 0.0);
        for r in 0..n {
            if ignore && rows[r] == -100 {
                per_row.push(0.0);
                continue;
            }
            let x = &raw[r * c..(r + 1) * c];
            let m = x.iter().cloned().fold(f64::MIN, f64::max);
            let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            let w = |k: usize| if weighted { weight_values[k] } else { 1.0 };
            let t = rows[r] as usize;
            let nll = -w(t) * (x[t] - lse);
            let smooth = -(0..c).map(|k| w(k) * (x[k] - lse)).sum::<f64>() / c as f64;
            per_row.push((1.0 - eps) * nll + eps * smooth);
            divisor += w(t);
        }
        let opts = |reduction| ClassLoss {
            weight: weighted.then_some(&weight),
            ignore_index: ignore.then_some(-100),
            label_smoothing: eps,
            reduction,
        };
        let logits = Tensor::from_slice(&raw, [n, c], dev)?;
        let what = format!("weighted {weighted}, ignore {ignore}, smoothing {eps}");
        let total: f64 = per_row.iter().sum();
        let got =
            |r| -> Result<Vec<f64>> { values(&cross_entropy_with(&logits, &target, &opts(r))?) };
        close(&got(Reduction::None)?, &per_row, 1e-12, &what);
        close(&got(Reduction::Sum)?, &[total], 1e-12, &what);
        close(&got(Reduction::Mean)?, &[total / divisor], 1e-12, &what);
        if eps == 0.0 {
            let nll = nll_loss_with(&logits.log_softmax(-1)?, &target, &opts(Reduction::Mean))?;
            close(
                &values(&nll)?,
                &[total / divisor],
                1e-12,
                &format!("nll {what}"),
            );
        }
        gradcheck(
            dev,
            &[vec![n, c]],
            &|t| cross_entropy_with(&t[0], &target, &opts(Reduction::Mean)),
            &what,
        )?;
    }
    // Weights of the wrong length or dtype, and smoothing in nll_loss, are errors.
    let logits = Tensor::from_slice(&raw, [n, c], dev)?;
    let valid = Tensor::from_slice(&[2i64, 1, 0, 1, 2, 1], [n], dev)?;
    let short = Tensor::ones([2], DType::F64, dev)?;
    let opts = ClassLoss {
        weight: Some(&short),
        ..ClassLoss::default()
    };
    assert!(cross_entropy_with(&logits, &valid, &opts).is_err());
    let smoothed = ClassLoss {
        label_smoothing: 0.1,
        ..ClassLoss::default()
    };
    assert!(nll_loss_with(&logits, &valid, &smoothed).is_err());
    Ok(())
}

test_device!(
    class_weights_and_ignored_classes_match_pytorchs_definitions,
    weighted_losses
);

test_device!(one_hot_and_embedding_with_gradients, encodings);
test_device!(dropout_masks_match_the_cpu_and_scale, dropouts);

/// Host values of `n` elements: a ramp folded so that neighbours differ.
fn ramp(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| (((i + seed) * 7919) % 23) as f64 / 7.0 - 1.5)
        .collect()
}

/// Checks the gradients autograd gives `f`'s inputs against central differences (f64): the
/// loss is `Σ f(inputs) · r`, `r` fixed, so every output element matters.
fn gradcheck(
    dev: &Device,
    shapes: &[Vec<usize>],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    what: &str,
) -> Result<()> {
    let host: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| ramp(s.iter().product(), 3 * k + 1))
        .collect();
    let make = |vals: &[Vec<f64>], grad: bool| -> Result<Vec<Tensor>> {
        vals.iter()
            .zip(shapes)
            .map(|(v, s)| {
                let t = Tensor::from_slice(v, s.clone(), dev)?;
                if grad {
                    t.requires_grad_(true)
                } else {
                    Ok(t)
                }
            })
            .collect()
    };
    let weights = |out: &Tensor| -> Result<Tensor> {
        let n = out.numel();
        Tensor::from_slice(&ramp(n, 5), out.shape().to_vec(), dev)
    };
    let loss = |ts: &[Tensor]| -> Result<f64> {
        let out = f(ts)?;
        out.mul(&weights(&out)?)?
            .sum(Axes::All, false)?
            .item::<f64>()
    };
    let inputs = make(&host, true)?;
    let out = f(&inputs)?;
    out.mul(&weights(&out)?)?
        .sum(Axes::All, false)?
        .backward()?;
    let h = 1e-6;
    for (k, input) in inputs.iter().enumerate() {
        let analytic = values(&input.grad().unwrap())?;
        for i in 0..host[k].len() {
            let mut up = host.clone();
            up[k][i] += h;
            let mut down = host.clone();
            down[k][i] -= h;
            let numeric = (loss(&make(&up, false)?)? - loss(&make(&down, false)?)?) / (2.0 * h);
            assert!(
                (numeric - analytic[i]).abs() <= 1e-5 * numeric.abs().max(1.0),
                "{what}: input {k} element {i}: autograd {} vs finite difference {numeric}",
                analytic[i]
            );
        }
    }
    Ok(())
}

fn norms(dev: &Device) -> Result<()> {
    // Values against the definitions: layer_norm over the last axis.
    let (rows, cols) = (3usize, 5usize);
    let raw = ramp(rows * cols, 0);
    let x = Tensor::from_slice(&raw, [rows, cols], dev)?;
    let y = values(&layer_norm(&x, 1, None, None, 1e-5)?)?;
    for r in 0..rows {
        let row = &raw[r * cols..(r + 1) * cols];
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        let want: Vec<f64> = row
            .iter()
            .map(|v| (v - mean) / (var + 1e-5).sqrt())
            .collect();
        close(&y[r * cols..(r + 1) * cols], &want, 1e-12, "layer_norm");
    }
    // With a weight and a bias over rows a block stages: one kernel (the mean's sum — added as
    // its eager launch adds it on CUDA, in the workgroup's order on wgpu —, the variance's,
    // the scaled rows); the values those of the launches one by one.
    let mut g = Generator::new(5);
    let x = Tensor::randn([6, 1024], DType::F32, &mut g, dev)?;
    let w = Tensor::randn([1024], DType::F32, &mut g, dev)?;
    let b = Tensor::randn([1024], DType::F32, &mut g, dev)?;
    dev.flush()?;
    let forward = || no_grad(|| layer_norm(&x, 1, Some(&w), Some(&b), 1e-5));
    let profile = dev.profile(|| forward()?.realize())?;
    let kernels = profile
        .device_work()
        .filter(|r| r.kind == strata::RecordKind::Kernel)
        .count();
    let target = dev.backend().target();
    if dev.fusion() && target.fuses_row_prologue && target.fuses_row_epilogue {
        let want = if target.fuses_sum_prologue { 1 } else { 2 };
        assert_eq!(kernels, want, "layer_norm's forward on {}", dev.name());
    }
    let fused = forward()?.to_vec::<f32>()?;
    let before = dev.fusion();
    dev.set_fusion(false)?;
    let eager = forward()?.to_vec::<f32>()?;
    dev.set_fusion(before)?;
    if dev.kind() == strata::BackendKind::Wgpu {
        let near = fused
            .iter()
            .zip(&eager)
            .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0));
        assert!(near, "layer_norm fused and eager on {}", dev.name());
    } else {
        assert_eq!(fused, eager, "layer_norm fused and eager on {}", dev.name());
    }
    // batch_norm: training statistics per channel, the running ones updated, evaluation with
    // them; group_norm with one group per channel is instance normalization.
    let (n, c, l) = (4usize, 3usize, 2usize);
    let raw = ramp(n * c * l, 2);
    let x = Tensor::from_slice(&raw, [n, c, l], dev)?;
    let running = RunningStats {
        mean: Tensor::zeros([c], DType::F64, dev)?,
        var: Tensor::ones([c], DType::F64, dev)?,
        momentum: 0.1,
    };
    let y = values(&batch_norm(&x, Some(&running), None, None, true, 0.0)?)?;
    let (rm, rv) = (values(&running.mean)?, values(&running.var)?);
    for ch in 0..c {
        let at: Vec<usize> = (0..n)
            .flat_map(|s| (0..l).map(move |p| (s * c + ch) * l + p))
            .collect();
        let vals: Vec<f64> = at.iter().map(|&i| raw[i]).collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / vals.len() as f64;
        for &i in &at {
            close(
                &[y[i]],
                &[(raw[i] - mean) / var.sqrt()],
                1e-12,
                "batch_norm",
            );
        }
        close(&[rm[ch]], &[0.1 * mean], 1e-12, "running mean");
        let unbiased = var * vals.len() as f64 / (vals.len() - 1) as f64;
        close(&[rv[ch]], &[0.9 + 0.1 * unbiased], 1e-12, "running var");
    }
    let eval = values(&batch_norm(&x, Some(&running), None, None, false, 0.0)?)?;
    for (i, v) in raw.iter().enumerate() {
        let ch = (i / l) % c;
        close(
            &[eval[i]],
            &[(v - rm[ch]) / rv[ch].sqrt()],
            1e-12,
            "batch_norm eval",
        );
    }
    assert!(batch_norm(&x, None, None, None, false, 0.0).is_err());
    let inst = values(&group_norm(&x, c, None, None, 0.0)?)?;
    for s in 0..n {
        for ch in 0..c {
            let at = (s * c + ch) * l;
            let (a, b) = (raw[at], raw[at + 1]);
            let want = if a == b {
                [0.0, 0.0]
            } else {
                [(a - b).signum(), (b - a).signum()]
            };
            close(&inst[at..at + 2], &want, 1e-9, "group_norm (instance)");
        }
    }
    assert!(group_norm(&x, 2, None, None, 0.0).is_err());

    // Gradients against finite differences, with affine parameters and odd sizes.
    gradcheck(
        dev,
        &[vec![2, 3, 5], vec![5], vec![5]],
        &|t| layer_norm(&t[0], 1, Some(&t[1]), Some(&t[2]), 1e-5),
        "layer_norm",
    )?;
    gradcheck(
        dev,
        &[vec![2, 3, 5], vec![3, 5]],
        &|t| layer_norm(&t[0], 2, Some(&t[1]), None, 1e-5),
        "layer_norm over two axes",
    )?;
    gradcheck(
        dev,
        &[vec![3, 4], vec![4]],
        &|t| layer_norm(&t[0], 1, None, Some(&t[1]), 1e-5),
        "layer_norm with a bias alone",
    )?;
    // Mixed dtypes: a bf16 input with f32 parameters gets its gradient in bf16.
    let xb = Tensor::from_slice(&[1.0f32, 2.0, 4.0, 3.0, 0.5, -1.0], [2, 3], dev)?
        .to_dtype(DType::BF16)?
        .requires_grad_(true)?;
    let wb = Tensor::from_slice(&[1.0f32, 2.0, 0.5], [3], dev)?.requires_grad_(true)?;
    // (Through a computed bf16 input: a leaf's gradient is cast to its dtype anyway.)
    let xc = xb.mul(2.0)?;
    let yb = layer_norm(&xc, 1, Some(&wb), None, 1e-5)?;
    let loss = yb.mul(&yb)?.sum(Axes::All, false)?;
    let grads = strata::autograd::grad(&[&loss], &[&xc, &wb], None, false)?;
    let dtypes: Vec<DType> = grads.iter().flatten().map(|g| g.dtype()).collect();
    assert_eq!(dtypes, [DType::BF16, DType::F32], "on {}", dev.name());
    gradcheck(
        dev,
        &[vec![2, 4, 3], vec![4], vec![4]],
        &|t| group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5),
        "group_norm",
    )?;
    gradcheck(
        dev,
        &[vec![3, 2, 3], vec![2], vec![2]],
        &|t| batch_norm(&t[0], None, Some(&t[1]), Some(&t[2]), true, 1e-5),
        "batch_norm",
    )?;
    gradcheck(
        dev,
        &[vec![2, 3, 2, 3], vec![3]],
        &|t| batch_norm(&t[0], None, Some(&t[1]), None, true, 1e-5),
        "batch_norm with a weight only",
    )?;
    gradcheck(
        dev,
        &[vec![3, 2, 1, 3]],
        &|t| batch_norm(&t[0], None, None, None, true, 1e-5),
        "batch_norm without affine parameters",
    )?;
    // Runs of 16 positions: the statistics from `ChannelMoments` where the backend runs it.
    gradcheck(
        dev,
        &[vec![2, 2, 16], vec![2], vec![2]],
        &|t| batch_norm(&t[0], None, Some(&t[1]), Some(&t[2]), true, 1e-5),
        "batch_norm over runs of 16",
    )?;
    gradcheck(
        dev,
        &[vec![2, 3, 4], vec![5, 4], vec![5]],
        &|t| linear(&t[0], &t[1], Some(&t[2]))?.relu(),
        "linear + relu",
    )?;
    assert!(linear(&x, &Tensor::zeros([2, 3], DType::F64, dev)?, None).is_err());
    Ok(())
}

test_device!(
    norms_and_linear_match_definitions_and_finite_differences,
    norms
);

/// Layer norm forward and backward against their closed forms computed here in f64 from the
/// same values: rows longer than a vector's multiple and not, more rows than the kernels'
/// parts (the column sums of γ's and β's gradients over several rows a block), two normalized
/// axes, 16-bit floats, with and without γ and β. Where the backend runs `LayerNorm` and
/// `LayerNormBackward` for the rows, each way is that one kernel (and backward the column sums
/// over its parts).
fn layer_norm_kernels(dev: &Device) -> Result<()> {
    let mut gen = Generator::new(11);
    // (shape, normalized axes, dtype, with γ, with β, tolerance)
    type Case = (&'static [usize], usize, DType, bool, bool, f64);
    let cases: [Case; 5] = [
        (&[300, 4096], 1, DType::F32, true, true, 1e-4),
        (&[7, 1001], 1, DType::F32, true, false, 1e-4),
        (&[2100, 40], 1, DType::F32, false, true, 1e-4),
        (&[5, 3, 66], 2, DType::F16, true, true, 3e-2),
        (&[9, 40], 1, DType::BF16, false, false, 5e-2),
    ];
    for (shape, normalized, dtype, has_w, has_b, tol) in cases {
        let what = format!("{shape:?} {dtype} on {}", dev.name());
        let lead = shape.len() - normalized;
        let (rows, n) = (
            shape[..lead].iter().product::<usize>(),
            shape[lead..].iter().product::<usize>(),
        );
        let mut param = |on: bool| -> Result<Option<Tensor>> {
            on.then(|| {
                Tensor::randn(shape[lead..].to_vec(), dtype, &mut gen, dev)?.requires_grad_(true)
            })
            .transpose()
        };
        let (w, b) = (param(has_w)?, param(has_b)?);
        let x = Tensor::randn(shape.to_vec(), dtype, &mut gen, dev)?.requires_grad_(true)?;
        let gy = Tensor::randn(shape.to_vec(), dtype, &mut gen, dev)?;
        dev.flush()?;
        let mut y = None;
        let profile = dev.profile(|| {
            let out = layer_norm(&x, normalized, w.as_ref(), b.as_ref(), 1e-5)?;
            out.backward_with(&gy)?;
            y = Some(out);
            dev.flush()
        })?;
        let y = values(&y.expect("set by the profiled closure"))?;
        let runs = |name: &str| {
            profile
                .device_work()
                .filter(|r| r.name.ends_with(name))
                .count()
        };
        // (A backend that binds windows binds each operand whole: the widest is x.)
        let target = dev.backend().target();
        let binds = target.binding_limit.is_none_or(|limit| {
            (rows * n * dtype.itemsize()) as u64 + target.offset_align + 16 <= limit
        });
        let kernel =
            target.layer_norm_row >= n && target.layer_norm_dtypes.contains(&dtype) && binds;
        assert_eq!(
            runs("layer_norm"),
            kernel as usize,
            "layer norm kernels, {what}"
        );
        let backward = runs("layer_norm_backward");
        assert_eq!(
            backward, kernel as usize,
            "layer norm backward kernels, {what}"
        );
        let (xv, gv) = (values(&x)?, values(&gy)?);
        let wv = match &w {
            Some(w) => values(w)?,
            None => vec![1.0; n],
        };
        let bv = match &b {
            Some(b) => values(b)?,
            None => vec![0.0; n],
        };
        let (mut dx, mut dw, mut db) = (vec![0.0; rows * n], vec![0.0; n], vec![0.0; n]);
        let mut want_y = vec![0.0; rows * n];
        for r in 0..rows {
            let (xr, gr) = (&xv[r * n..(r + 1) * n], &gv[r * n..(r + 1) * n]);
            let mean = xr.iter().sum::<f64>() / n as f64;
            let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            let xhat: Vec<f64> = xr.iter().map(|v| (v - mean) * rstd).collect();
            let gh: Vec<f64> = gr.iter().zip(&wv).map(|(g, w)| g * w).collect();
            let a = gh.iter().sum::<f64>() / n as f64;
            let bb = gh.iter().zip(&xhat).map(|(g, h)| (g - a) * h).sum::<f64>() / n as f64;
            for i in 0..n {
                want_y[r * n + i] = xhat[i] * wv[i] + bv[i];
                dx[r * n + i] = (gh[i] - a - xhat[i] * bb) * rstd;
                dw[i] += gr[i] * xhat[i];
                db[i] += gr[i];
            }
        }
        close(&y, &want_y, tol, &format!("y, {what}"));
        let grad = |t: &Tensor| values(&t.grad().expect("a gradient"));
        close(&grad(&x)?, &dx, tol, &format!("dx, {what}"));
        // Column sums over many rows: their error grows with the rows' count.
        let col_tol = tol * (rows as f64).sqrt();
        if let Some(w) = &w {
            close(&grad(w)?, &dw, col_tol, &format!("dγ, {what}"));
        }
        if let Some(b) = &b {
            close(&grad(b)?, &db, col_tol, &format!("dβ, {what}"));
        }
    }
    Ok(())
}

test_device!(
    layer_norm_both_ways_matches_its_closed_forms,
    layer_norm_kernels
);

/// Batch norm in training against its closed forms computed here in f64 from the same values
/// — the statistics, `y`, the running statistics, and the gradients of `x`, `γ` and `β` for
/// a random upstream gradient: channels of many values (several slices a channel where the
/// backend splits them), runs of positions not a vector's multiple, a channel far from zero
/// (1,000 + N(0, 1): `Σx² − (Σx)²/n` would lose its variance in f32), 16-bit floats and f64,
/// and `[N, C]` (no positions). Where the backend runs `ChannelMoments` and `ChannelGradSums`
/// for the dtype and the runs are long enough, the statistics and the backward's sums are
/// each that one kernel.
fn batch_norm_statistics(dev: &Device) -> Result<()> {
    let mut gen = Generator::new(12);
    // (shape, dtype, offset, tolerance)
    type Case = (&'static [usize], DType, f64, f64);
    let cases: [Case; 7] = [
        (&[64, 4, 8, 64], DType::F32, 0.0, 1e-4),
        (&[3, 5, 17], DType::F32, 0.0, 1e-4),
        (&[32, 2, 64], DType::F32, 1000.0, 2e-3),
        (&[2, 3, 4, 4], DType::F64, 0.0, 1e-10),
        (&[16, 3, 32], DType::F16, 0.0, 3e-2),
        (&[8, 3, 2, 16], DType::BF16, 0.0, 5e-2),
        (&[40, 6], DType::F32, 0.0, 1e-4),
    ];
    for (shape, dtype, offset, tol) in cases {
        let what = format!("{shape:?} {dtype} on {}", dev.name());
        let (n, c) = (shape[0], shape[1]);
        let inner: usize = shape[2..].iter().product();
        let x = Tensor::randn(shape.to_vec(), DType::F64, &mut gen, dev)?
            .add(offset)?
            .to_dtype(dtype)?
            .requires_grad_(true)?;
        let w = Tensor::randn([c], dtype, &mut gen, dev)?.requires_grad_(true)?;
        let b = Tensor::randn([c], dtype, &mut gen, dev)?.requires_grad_(true)?;
        let gy = Tensor::randn(shape.to_vec(), dtype, &mut gen, dev)?;
        let running = RunningStats {
            mean: Tensor::zeros([c], dtype, dev)?,
            var: Tensor::zeros([c], dtype, dev)?,
            momentum: 1.0,
        };
        dev.flush()?;
        let mut y = None;
        let profile = dev.profile(|| {
            let out = batch_norm(&x, Some(&running), Some(&w), Some(&b), true, 1e-5)?;
            out.backward_with(&gy)?;
            y = Some(out);
            dev.flush()
        })?;
        let y = values(&y.expect("set by the profiled closure"))?;
        let target = dev.backend().target();
        let runs = |name: &str| {
            profile
                .device_work()
                .filter(|r| r.name.ends_with(name))
                .count()
        };
        let long = inner >= 16;
        let moments = target.channel_moments_dtypes.contains(&dtype) && long;
        assert_eq!(
            runs("channel_moments"),
            moments as usize,
            "statistics, {what}"
        );
        // (Six tensors bound: under fewer bindings the two reductions.)
        let sums = target.channel_sums_dtypes.contains(&dtype) && long && target.binds(6);
        assert_eq!(runs("channel_grad_sums"), sums as usize, "sums, {what}");
        let (xv, gv) = (values(&x)?, values(&gy)?);
        let (wv, bv) = (values(&w)?, values(&b)?);
        let (rm, rv) = (values(&running.mean)?, values(&running.var)?);
        let grad = |t: &Tensor| values(&t.grad().expect("a gradient"));
        let (dx, dw, db) = (grad(&x)?, grad(&w)?, grad(&b)?);
        for ch in 0..c {
            let at: Vec<usize> = (0..n)
                .flat_map(|s| (0..inner).map(move |p| (s * c + ch) * inner + p))
                .collect();
            let count = at.len() as f64;
            let mean = at.iter().map(|&i| xv[i]).sum::<f64>() / count;
            let var = at.iter().map(|&i| (xv[i] - mean).powi(2)).sum::<f64>() / count;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            close(
                &[rm[ch]],
                &[mean],
                tol,
                &format!("mean of channel {ch}, {what}"),
            );
            let unbiased = var * count / (count - 1.0);
            close(
                &[rv[ch]],
                &[unbiased],
                tol,
                &format!("variance of channel {ch}, {what}"),
            );
            let xhat: Vec<f64> = at.iter().map(|&i| (xv[i] - mean) * rstd).collect();
            let want: Vec<f64> = xhat.iter().map(|h| h * wv[ch] + bv[ch]).collect();
            let got: Vec<f64> = at.iter().map(|&i| y[i]).collect();
            close(&got, &want, tol, &format!("y of channel {ch}, {what}"));
            let sum_g: f64 = at.iter().map(|&i| gv[i]).sum();
            let sum_gx: f64 = at.iter().zip(&xhat).map(|(&i, h)| gv[i] * h).sum();
            // Sums of `count` terms of about 1: their error grows as the count's square root,
            // and so does the sum (random signs), so the tolerance is absolute, not relative.
            let sum_tol = tol * count.sqrt();
            for (got, want, name) in [(db[ch], sum_g, "dβ"), (dw[ch], sum_gx, "dγ")] {
                assert!(
                    (got - want).abs() <= sum_tol,
                    "{name} of channel {ch}, {what}: {got} vs {want}"
                );
            }
            let want_dx: Vec<f64> = at
                .iter()
                .zip(&xhat)
                .map(|(&i, h)| wv[ch] * rstd * (gv[i] - sum_g / count - h * sum_gx / count))
                .collect();
            let got_dx: Vec<f64> = at.iter().map(|&i| dx[i]).collect();
            close(
                &got_dx,
                &want_dx,
                tol,
                &format!("dx of channel {ch}, {what}"),
            );
        }
    }
    Ok(())
}

test_device!(
    batch_norm_statistics_match_their_closed_forms,
    batch_norm_statistics
);

/// Visits every term of `conv2d` on the host, from its definition: for each output element,
/// channel and kernel offset inside the input, `term(y index, x index, k index)`, an output's
/// terms one after another.
#[allow(clippy::too_many_arguments)]
fn conv_terms(
    [n, c, h, w]: [usize; 4],
    [o, cg, kh, kw]: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
    mut term: impl FnMut(usize, usize, usize),
) {
    let [oh, ow] = conv_out([h, w], [kh, kw], stride, pad, dil);
    let og = o / groups;
    for s in 0..n {
        for oc in 0..o {
            let g = oc / og;
            for a in 0..oh {
                for b in 0..ow {
                    let yi = ((s * o + oc) * oh + a) * ow + b;
                    for ci in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let hh = (a * stride[0] + i * dil[0]) as isize - pad[0] as isize;
                                let ww = (b * stride[1] + j * dil[1]) as isize - pad[1] as isize;
                                if hh < 0 || ww < 0 || hh >= h as isize || ww >= w as isize {
                                    continue;
                                }
                                let xi =
                                    ((s * c + g * cg + ci) * h + hh as usize) * w + ww as usize;
                                term(yi, xi, ((oc * cg + ci) * kh + i) * kw + j);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// conv2d's output (height, width) for an input and kernel of these sizes.
fn conv_out(
    [h, w]: [usize; 2],
    [kh, kw]: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
) -> [usize; 2] {
    [
        (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1,
        (w + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1,
    ]
}

/// conv2d on the host: the sum of each output's terms.
#[allow(clippy::too_many_arguments)]
fn host_conv(
    x: &[f64],
    shape: [usize; 4],
    k: &[f64],
    kshape: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
) -> (Vec<f64>, [usize; 2]) {
    let [oh, ow] = conv_out(
        [shape[2], shape[3]],
        [kshape[2], kshape[3]],
        stride,
        pad,
        dil,
    );
    let mut y = vec![0.0; shape[0] * kshape[0] * oh * ow];
    conv_terms(shape, kshape, stride, pad, dil, groups, |yi, xi, ki| {
        y[yi] += x[xi] * k[ki]
    });
    (y, [oh, ow])
}

fn windows(dev: &Device) -> Result<()> {
    // conv2d against the host loops: stride, padding, dilation, groups, odd sizes.
    for (shape, kshape, stride, pad, dil, groups) in [
        ([2, 3, 7, 6], [4, 3, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        ([1, 4, 9, 8], [6, 2, 3, 2], [2, 3], [2, 1], [1, 2], 2),
        ([2, 2, 5, 5], [2, 1, 1, 1], [2, 2], [0, 0], [1, 1], 2),
    ] {
        let xs = ramp(shape.iter().product(), 1);
        let ks = ramp(kshape.iter().product(), 4);
        let x = Tensor::from_slice(&xs, shape.to_vec(), dev)?;
        let k = Tensor::from_slice(&ks, kshape.to_vec(), dev)?;
        let b = Tensor::from_slice(&ramp(kshape[0], 9), [kshape[0]], dev)?;
        let (want, [oh, ow]) = host_conv(&xs, shape, &ks, kshape, stride, pad, dil, groups);
        let y = conv2d(&x, &k, None, stride, pad, dil, groups)?;
        assert_eq!(y.shape(), &[shape[0], kshape[0], oh, ow]);
        close(&values(&y)?, &want, 1e-12, "conv2d");
        let with_bias = values(&conv2d(&x, &k, Some(&b), stride, pad, dil, groups)?)?;
        let bv = values(&b)?;
        let plane = oh * ow;
        let shifted: Vec<f64> = want
            .iter()
            .enumerate()
            .map(|(i, v)| v + bv[(i / plane) % kshape[0]])
            .collect();
        close(&with_bias, &shifted, 1e-12, "conv2d bias");
    }
    assert!(conv2d(
        &Tensor::zeros([1, 3, 4, 4], DType::F64, dev)?,
        &Tensor::zeros([2, 2, 3, 3], DType::F64, dev)?,
        None,
        [1, 1],
        [0, 0],
        [1, 1],
        1
    )
    .is_err());
    assert!(conv2d(
        &Tensor::zeros([1, 1, 2, 2], DType::F64, dev)?,
        &Tensor::zeros([1, 1, 3, 3], DType::F64, dev)?,
        None,
        [1, 1],
        [0, 0],
        [1, 1],
        1
    )
    .is_err());

    // Pooling against the host: max (first of ties, its index), average, adaptive.
    let shape = [2usize, 2, 5, 6];
    let xs: Vec<f64> = (0..shape.iter().product::<usize>())
        .map(|i| ((i * 7919) % 13) as f64)
        .collect();
    let x = Tensor::from_slice(&xs, shape.to_vec(), dev)?;
    let (kernel, stride, pad) = ([3usize, 2usize], [2usize, 2usize], [1usize, 1usize]);
    let (v, idx) = max_pool2d(&x, kernel, stride, pad)?;
    let (oh, ow) = ((5 + 2 - 3) / 2 + 1, (6 + 2 - 2) / 2 + 1);
    assert_eq!(v.shape(), &[2, 2, oh, ow]);
    let (vv, iv) = (values(&v)?, idx.to_vec::<i64>()?);
    let avg = values(&avg_pool2d(&x, kernel, stride, pad)?)?;
    for p in 0..4 {
        for a in 0..oh {
            for b in 0..ow {
                let (mut best, mut at, mut sum) = (f64::NEG_INFINITY, -1i64, 0.0);
                for i in 0..3 {
                    for j in 0..2 {
                        let (hh, ww) = ((a * 2 + i) as isize - 1, (b * 2 + j) as isize - 1);
                        if hh < 0 || ww < 0 || hh >= 5 || ww >= 6 {
                            continue;
                        }
                        let val = xs[p * 30 + hh as usize * 6 + ww as usize];
                        sum += val;
                        if val > best {
                            (best, at) = (val, hh as i64 * 6 + ww as i64);
                        }
                    }
                }
                let o = (p * oh + a) * ow + b;
                assert_eq!(
                    (vv[o], iv[o]),
                    (best, at),
                    "max_pool2d at plane {p} ({a}, {b})"
                );
                close(&[avg[o]], &[sum / 6.0], 1e-12, "avg_pool2d");
            }
        }
    }
    let ad = values(&adaptive_avg_pool2d(&x, [2, 4])?)?;
    for p in 0..4 {
        for a in 0..2 {
            for b in 0..4 {
                let (r0, r1) = (a * 5 / 2, ((a + 1) * 5usize).div_ceil(2));
                let (c0, c1) = (b * 6 / 4, ((b + 1) * 6usize).div_ceil(4));
                let cells: Vec<f64> = (r0..r1)
                    .flat_map(|r| (c0..c1).map(move |c| (r, c)))
                    .map(|(r, c)| xs[p * 30 + r * 6 + c])
                    .collect();
                close(
                    &[ad[(p * 2 + a) * 4 + b]],
                    &[cells.iter().sum::<f64>() / cells.len() as f64],
                    1e-12,
                    "adaptive_avg_pool2d",
                );
            }
        }
    }
    assert!(max_pool2d(&x, [2, 2], [1, 1], [2, 2]).is_err());

    // A window of -inf values takes its first real cell, never a padding cell (PyTorch's
    // index); the backward adds each gradient there without reading back to the host.
    let (h, w) = (3usize, 4usize);
    let mut xs = vec![f64::NEG_INFINITY; h * w];
    xs[5] = 1.0;
    let x = Tensor::from_slice(&xs, [1, 1, h, w], dev)?.requires_grad_(true)?;
    let (v, idx) = max_pool2d(&x, [2, 2], [1, 1], [1, 1])?;
    let iv = idx.to_vec::<i64>()?;
    let mut counts = vec![0.0; h * w];
    for a in 0..=h {
        for b in 0..=w {
            let mut best: Option<(f64, usize)> = None;
            for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let (r, c) = ((a + i).wrapping_sub(1), (b + j).wrapping_sub(1));
                if r >= h || c >= w {
                    continue;
                }
                let val = xs[r * w + c];
                if best.is_none_or(|(bv, _)| val > bv) {
                    best = Some((val, r * w + c));
                }
            }
            let at = best.expect("a real cell in every window").1;
            assert_eq!(iv[a * (w + 1) + b], at as i64, "-inf window ({a}, {b})");
            counts[at] += 1.0;
        }
    }
    dev.flush()?;
    let backward = dev.profile(|| v.sum(Axes::All, false)?.backward())?;
    let reads = backward
        .records
        .iter()
        .filter(|r| matches!(r.kind, RecordKind::Download | RecordKind::Synchronize))
        .count();
    assert_eq!(reads, 0, "max_pool2d's backward read back:\n{backward}");
    assert_eq!(values(&x.grad().expect("a gradient"))?, counts);
    // Indices written after the forward pass are not trusted: the backward refuses them.
    let (v, idx) = max_pool2d(&x, [2, 2], [1, 1], [1, 1])?;
    let everywhere = Tensor::ones(idx.shape().to_vec(), DType::Bool, dev)?;
    idx.masked_fill_(&everywhere, 1000)?;
    let err = v
        .sum(Axes::All, false)?
        .backward()
        .expect_err("a written index");
    assert!(err.to_string().contains("MaxPool2dBackward"), "{err}");

    // Gradients against finite differences (distinct values, so the max is unique).
    gradcheck(
        dev,
        &[vec![1, 2, 5, 4], vec![3, 2, 2, 3], vec![3]],
        &|t| conv2d(&t[0], &t[1], Some(&t[2]), [2, 1], [1, 2], [2, 1], 1),
        "conv2d",
    )?;
    gradcheck(
        dev,
        &[vec![1, 4, 4, 3], vec![2, 2, 3, 3]],
        &|t| conv2d(&t[0], &t[1], None, [1, 1], [1, 1], [1, 1], 2),
        "conv2d groups",
    )?;
    gradcheck(
        dev,
        &[vec![1, 2, 5, 4]],
        &|t| Ok(max_pool2d(&t[0], [2, 3], [2, 1], [1, 1])?.0),
        "max_pool2d",
    )?;
    gradcheck(
        dev,
        &[vec![1, 2, 5, 4]],
        &|t| avg_pool2d(&t[0], [3, 2], [1, 2], [1, 0]),
        "avg_pool2d",
    )?;
    gradcheck(
        dev,
        &[vec![1, 2, 5, 4]],
        &|t| adaptive_avg_pool2d(&t[0], [3, 3]),
        "adaptive_avg_pool2d",
    )?;
    Ok(())
}

test_device!(
    convolution_and_pooling_match_loops_and_finite_differences,
    windows
);

/// Each convolution pass of stride 1 is one kernel (cuDNN on CUDA, or strata's own implicit GEMM without
/// it, `STRATA_CUDNN=0`; implicit GEMM on wgpu; the CPU's loops), gathering its taps as it goes
/// (no im2col copy, no matmul per tap); values and both gradients against the host. Under a small binding cap
/// (`STRATA_WGPU_MAX_BINDING=1536`, scripts/test.sh) wgpu runs it in pieces of one sample,
/// backward filter adding each piece to a partial product that spans several.
fn convolution_kernels(dev: &Device) -> Result<()> {
    // Products of many columns (64×64 tiles), of 4 columns (backward data into 4 channels:
    // 256×16 tiles) and, unless a binding cap is set (the weight would not fit), of 8 rows
    // (backward filter of 8 output channels over 32·9 columns: 16×256 tiles).
    let mut cases = vec![([6usize, 4, 8, 8], [4usize, 4, 3, 3])];
    if std::env::var_os("STRATA_WGPU_MAX_BINDING").is_none() {
        cases.push(([2, 32, 5, 4], [8, 32, 3, 3]));
    }
    for (shape, kshape) in cases {
        one_kernel_a_pass(dev, shape, kshape)?;
    }
    let one = [1, 1];
    // No integer convolution (nor in PyTorch): an error naming the dtypes.
    let xi = Tensor::zeros([1, 4, 3, 3], DType::I32, dev)?;
    let ki = Tensor::zeros([2, 4, 3, 3], DType::I64, dev)?;
    let e = conv2d(&xi, &ki, None, one, one, one, 1).unwrap_err();
    assert!(e.to_string().contains("i32 and i64"), "{e}");
    let e = conv_transpose2d(&xi, &ki.transpose(0, 1)?, None, one, one, [0, 0], one, 1);
    assert!(e.is_err());
    Ok(())
}

/// conv2d of `shape` by `kshape` (padding 1) and both its gradients: one kernel a pass, and
/// the values of the host's loops.
fn one_kernel_a_pass(dev: &Device, shape: [usize; 4], kshape: [usize; 4]) -> Result<()> {
    let one = [1, 1];
    let x = Tensor::from_slice(&ramp(shape.iter().product(), 2), shape.to_vec(), dev)?
        .to_dtype(DType::F32)?
        .requires_grad_(true)?;
    let k = Tensor::from_slice(&ramp(kshape.iter().product(), 3), kshape.to_vec(), dev)?
        .to_dtype(DType::F32)?
        .requires_grad_(true)?;
    let (xs, ks) = (values(&x)?, values(&k)?);
    let (want, [oh, ow]) = host_conv(&xs, shape, &ks, kshape, one, one, one, 1);
    let out = [shape[0], kshape[0], oh, ow];
    let r = Tensor::from_slice(&ramp(out.iter().product(), 5), out.to_vec(), dev)?
        .to_dtype(DType::F32)?;
    for t in [&x, &k, &r] {
        t.realize()?;
    }
    dev.synchronize()?;
    let mut y = None;
    let forward = dev.profile(|| {
        y = Some(conv2d(&x, &k, None, one, one, one, 1)?);
        dev.flush()
    })?;
    let y = y.expect("set by the profiled closure");
    let backward = dev.profile(|| {
        y.mul(&r)?.sum(Axes::All, false)?.backward()?;
        dev.flush()
    })?;
    // Kernels, and those of the convolution's own node ("Convolution…" among their ops).
    let kernels = |p: &strata::Profile, conv_only: bool| {
        p.device_work()
            .filter(|r| r.kind == strata::RecordKind::Kernel)
            .filter(|r| !conv_only || r.ops.iter().any(|op| op.contains("Convolution")))
            .count()
    };
    let what = format!("x {shape:?}, w {kshape:?} on {}", dev.name());
    assert_eq!(
        kernels(&forward, false),
        1,
        "conv2d forward of {what}:\n{forward}"
    );
    // Backward: the product with r and its sum's gradient (fused or not), then the two
    // convolution passes, one kernel each.
    assert_eq!(
        kernels(&backward, true),
        2,
        "conv2d backward of {what}:\n{backward}"
    );
    // cuDNN runs each pass as a graph whose plan was built once (not the legacy calls, which
    // rebuild it at every call), unless told otherwise.
    let graphs = std::env::var("STRATA_CUDNN_GRAPH").map_or(true, |v| v != "0");
    for r in forward.device_work().chain(backward.device_work()) {
        if graphs && r.name.starts_with("cuDNN") {
            let launch = r.launch.as_deref().unwrap_or("");
            assert!(
                launch.contains("(cuDNN graph"),
                "{what}: {} ran {launch}",
                r.name
            );
        }
    }
    // cuDNN picks each pass's algorithm by timing its candidates: a Winograd one, whose f32
    // error is about 1e-4 of the values, wins some runs (seen on an H200: 8.6e-5).
    let tol = match dev.kind() {
        strata::BackendKind::Cuda => 3e-4,
        _ => 1e-5,
    };
    close(&values(&y)?, &want, tol, &format!("conv2d of {what}"));
    let (gx, gk) = host_conv_grads(&xs, shape, &ks, kshape, &values(&r)?, one, one, one, 1);
    close(
        &values(&x.grad().unwrap())?,
        &gx,
        tol,
        &format!("input gradient of {what}"),
    );
    close(
        &values(&k.grad().unwrap())?,
        &gk,
        tol,
        &format!("weight gradient of {what}"),
    );
    Ok(())
}

test_device!(
    each_convolution_pass_is_one_kernel_where_the_backend_has_them,
    convolution_kernels
);

/// Both gradients of `Σ conv2d(x, k) · r` on the host: each term `x · k` of an output adds
/// `r · k` to `x`'s gradient and `r · x` to `k`'s.
#[allow(clippy::too_many_arguments)]
fn host_conv_grads(
    x: &[f64],
    shape: [usize; 4],
    k: &[f64],
    kshape: [usize; 4],
    r: &[f64],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut gx, mut gk) = (vec![0.0; x.len()], vec![0.0; k.len()]);
    conv_terms(shape, kshape, stride, pad, dil, groups, |yi, xi, ki| {
        gx[xi] += r[yi] * k[ki];
        gk[ki] += r[yi] * x[xi];
    });
    (gx, gk)
}

/// conv2d and conv_transpose2d in every float dtype the device has (the dtypes cuDNN runs:
/// f32, f16, bf16 accumulating in f32, f64), values and both gradients against the host on
/// the dtype's rounded inputs; empty operands give zeros.
fn convolution_dtypes(dev: &Device) -> Result<()> {
    let (shape, kshape) = ([3usize, 8, 11, 9], [12usize, 4, 3, 3]);
    let (stride, pad, dil, groups) = ([2, 1], [1, 1], [1, 2], 2);
    for (dtype, tol) in [
        (DType::F64, 1e-12),
        (DType::F32, 1e-5),
        (DType::F16, 1.5e-2),
        (DType::BF16, 1e-1),
    ] {
        if dev.backend().check_dtype(dtype).is_err() {
            continue;
        }
        // A 1×1 window stepping one pixel (a matmul per sample) and its transpose.
        let (ps, pk) = ([3usize, 8, 5, 7], [6usize, 8, 1, 1]);
        let x = Tensor::from_slice(&ramp(ps.iter().product(), 2), ps.to_vec(), dev)?
            .to_dtype(dtype)?
            .requires_grad_(true)?;
        let k = Tensor::from_slice(&ramp(pk.iter().product(), 3), pk.to_vec(), dev)?
            .to_dtype(dtype)?
            .requires_grad_(true)?;
        let (xs, ks) = (values(&x)?, values(&k)?);
        let one = [1, 1];
        let (want, _) = host_conv(&xs, ps, &ks, pk, one, [0, 0], one, 1);
        let y = conv2d(&x, &k, None, one, [0, 0], one, 1)?;
        assert_eq!(y.shape(), &[3, 6, 5, 7]);
        let what = |op: &str| format!("1×1 {op} in {dtype} on {}", dev.name());
        close(&values(&y)?, &want, tol, &what("conv2d"));
        let r =
            Tensor::from_slice(&ramp(y.numel(), 5), y.shape().to_vec(), dev)?.to_dtype(dtype)?;
        y.mul(&r)?.sum(Axes::All, false)?.backward()?;
        let (gx, gk) = host_conv_grads(&xs, ps, &ks, pk, &values(&r)?, one, [0, 0], one, 1);
        close(
            &values(&x.grad().unwrap())?,
            &gx,
            4.0 * tol,
            &what("input gradient"),
        );
        close(
            &values(&k.grad().unwrap())?,
            &gk,
            4.0 * tol,
            &what("weight gradient"),
        );
        let kt = Tensor::from_slice(&ramp(6 * 8, 6), [6, 8, 1, 1], dev)?.to_dtype(dtype)?;
        let t = conv_transpose2d(&y.detach(), &kt, None, one, [0, 0], [0, 0], one, 1)?;
        let (want, _) = host_conv_transpose(
            &values(&y)?,
            [3, 6, 5, 7],
            &values(&kt)?,
            [6, 8, 1, 1],
            one,
            [0, 0],
            [0, 0],
            one,
            1,
        );
        assert_eq!(t.shape(), &[3, 8, 5, 7]);
        close(&values(&t)?, &want, tol, &what("conv_transpose2d"));
    }
    for (dtype, tol) in [
        (DType::F64, 1e-12),
        (DType::F32, 1e-5),
        // 16-bit: accumulated in f32 everywhere, rounded once; the bound is the dtype's.
        (DType::F16, 1.5e-2),
        (DType::BF16, 1e-1),
    ] {
        if dev.backend().check_dtype(dtype).is_err() {
            continue;
        }
        let what = |op: &str| format!("{op} in {dtype} on {}", dev.name());
        let x = Tensor::from_slice(&ramp(shape.iter().product(), 1), shape.to_vec(), dev)?
            .to_dtype(dtype)?
            .requires_grad_(true)?;
        let k = Tensor::from_slice(&ramp(kshape.iter().product(), 4), kshape.to_vec(), dev)?
            .to_dtype(dtype)?
            .requires_grad_(true)?;
        let (xs, ks) = (values(&x)?, values(&k)?);
        let (want, [oh, ow]) = host_conv(&xs, shape, &ks, kshape, stride, pad, dil, groups);
        let y = conv2d(&x, &k, None, stride, pad, dil, groups)?;
        assert_eq!(y.dtype(), dtype);
        close(&values(&y)?, &want, tol, &what("conv2d"));
        let r =
            Tensor::from_slice(&ramp(y.numel(), 5), y.shape().to_vec(), dev)?.to_dtype(dtype)?;
        y.mul(&r)?.sum(Axes::All, false)?.backward()?;
        let (gx, gk) = host_conv_grads(
            &xs,
            shape,
            &ks,
            kshape,
            &values(&r)?,
            stride,
            pad,
            dil,
            groups,
        );
        // The gradients sum more terms (up to N·OH·OW for the weight's): a looser bound.
        close(
            &values(&x.grad().unwrap())?,
            &gx,
            4.0 * tol,
            &what("conv2d's input gradient"),
        );
        close(
            &values(&k.grad().unwrap())?,
            &gk,
            4.0 * tol,
            &what("conv2d's weight gradient"),
        );

        // conv_transpose2d of y's shape back to x's (its weight is [C_in, O/g, kH, kW]).
        let yv = Tensor::from_slice(&ramp(3 * 12 * oh * ow, 2), [3, 12, oh, ow], dev)?
            .to_dtype(dtype)?;
        let kt = Tensor::from_slice(&ramp(12 * 4 * 9, 6), [12, 4, 3, 3], dev)?.to_dtype(dtype)?;
        let out_pad = [(11 + 2 - 2 * 2 - 1) % 2, 0];
        let t = conv_transpose2d(&yv, &kt, None, stride, pad, out_pad, dil, groups)?;
        let (want, [th, tw]) = host_conv_transpose(
            &values(&yv)?,
            [3, 12, oh, ow],
            &values(&kt)?,
            [12, 4, 3, 3],
            stride,
            pad,
            out_pad,
            dil,
            groups,
        );
        assert_eq!(t.shape(), &[3, 8, th, tw]);
        close(&values(&t)?, &want, tol, &what("conv_transpose2d"));

        // Empty operands: no terms, zeros of the output's shape.
        let none = conv2d(
            &Tensor::zeros([2, 0, 5, 5], dtype, dev)?,
            &Tensor::zeros([3, 0, 3, 3], dtype, dev)?,
            None,
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        )?;
        assert_eq!(none.shape(), &[2, 3, 3, 3]);
        assert!(values(&none)?.iter().all(|&v| v == 0.0));
        let no_batch = conv2d(
            &Tensor::zeros([0, 4, 5, 5], dtype, dev)?,
            &Tensor::zeros([3, 4, 3, 3], dtype, dev)?,
            None,
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        )?;
        assert_eq!(no_batch.shape(), &[0, 3, 3, 3]);
    }
    Ok(())
}

test_device!(
    convolutions_in_every_float_dtype_match_the_host_with_gradients,
    convolution_dtypes
);

/// conv_transpose2d on the host, from its definition: each input pixel adds the kernel,
/// scaled by the pixel, into the output at stride·position − padding (+ dilation·offset).
#[allow(clippy::too_many_arguments)]
fn host_conv_transpose(
    x: &[f64],
    [n, c, h, w]: [usize; 4],
    k: &[f64],
    [_, og, kh, kw]: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    out_pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
) -> (Vec<f64>, [usize; 2]) {
    let oh = (h - 1) * stride[0] + dil[0] * (kh - 1) + out_pad[0] + 1 - 2 * pad[0];
    let ow = (w - 1) * stride[1] + dil[1] * (kw - 1) + out_pad[1] + 1 - 2 * pad[1];
    let (cg, o) = (c / groups, og * groups);
    let mut y = vec![0.0; n * o * oh * ow];
    for s in 0..n {
        for ci in 0..c {
            let g = ci / cg;
            for a in 0..h {
                for b in 0..w {
                    let v = x[((s * c + ci) * h + a) * w + b];
                    for oc in 0..og {
                        for i in 0..kh {
                            for j in 0..kw {
                                let hh = (a * stride[0] + i * dil[0]) as isize - pad[0] as isize;
                                let ww = (b * stride[1] + j * dil[1]) as isize - pad[1] as isize;
                                if hh < 0 || ww < 0 || hh >= oh as isize || ww >= ow as isize {
                                    continue;
                                }
                                let yi =
                                    ((s * o + g * og + oc) * oh + hh as usize) * ow + ww as usize;
                                y[yi] += v * k[((ci * og + oc) * kh + i) * kw + j];
                            }
                        }
                    }
                }
            }
        }
    }
    (y, [oh, ow])
}

/// conv_transpose2d against its definition (stride, padding larger than the kernel's half,
/// output padding, dilation, groups, odd sizes), with a bias, its gradients against finite
/// differences, and the errors.
fn transposed_convolution(dev: &Device) -> Result<()> {
    type Case = (
        [usize; 4],
        [usize; 4],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
    );
    let cases: [Case; 4] = [
        (
            [2, 3, 4, 5],
            [3, 2, 3, 3],
            [1, 1],
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        ),
        (
            [1, 4, 3, 3],
            [4, 3, 3, 2],
            [2, 3],
            [1, 0],
            [1, 2],
            [1, 1],
            2,
        ),
        (
            [1, 2, 3, 4],
            [2, 1, 2, 3],
            [2, 2],
            [2, 1],
            [0, 1],
            [2, 1],
            2,
        ),
        (
            [2, 1, 2, 2],
            [1, 2, 1, 1],
            [3, 2],
            [0, 0],
            [2, 1],
            [1, 1],
            1,
        ),
    ];
    for (shape, kshape, stride, pad, out_pad, dil, groups) in cases {
        let xs = ramp(shape.iter().product(), 2);
        let ks = ramp(kshape.iter().product(), 6);
        let x = Tensor::from_slice(&xs, shape.to_vec(), dev)?;
        let k = Tensor::from_slice(&ks, kshape.to_vec(), dev)?;
        let (want, [oh, ow]) =
            host_conv_transpose(&xs, shape, &ks, kshape, stride, pad, out_pad, dil, groups);
        let o = kshape[1] * groups;
        let y = conv_transpose2d(&x, &k, None, stride, pad, out_pad, dil, groups)?;
        assert_eq!(y.shape(), &[shape[0], o, oh, ow], "{shape:?} {kshape:?}");
        close(&values(&y)?, &want, 1e-12, "conv_transpose2d");
        let b = Tensor::from_slice(&ramp(o, 3), [o], dev)?;
        let with_bias = values(&conv_transpose2d(
            &x,
            &k,
            Some(&b),
            stride,
            pad,
            out_pad,
            dil,
            groups,
        )?)?;
        let bv = values(&b)?;
        let shifted: Vec<f64> = want
            .iter()
            .enumerate()
            .map(|(i, v)| v + bv[(i / (oh * ow)) % o])
            .collect();
        close(&with_bias, &shifted, 1e-12, "conv_transpose2d bias");
        gradcheck(
            dev,
            &[shape.to_vec(), kshape.to_vec(), vec![o]],
            &|t| conv_transpose2d(&t[0], &t[1], Some(&t[2]), stride, pad, out_pad, dil, groups),
            "conv_transpose2d",
        )?;
    }
    let x = Tensor::zeros([1, 2, 3, 3], DType::F64, dev)?;
    let bad =
        |k: [usize; 4], stride: [usize; 2], out_pad: [usize; 2], groups: usize| -> Result<bool> {
            let k = Tensor::zeros(k.to_vec(), DType::F64, dev)?;
            Ok(conv_transpose2d(&x, &k, None, stride, [0, 0], out_pad, [1, 1], groups).is_err())
        };
    assert!(
        bad([3, 1, 2, 2], [1, 1], [0, 0], 1)?,
        "weight's in-channels differ"
    );
    assert!(
        bad([2, 1, 2, 2], [2, 2], [2, 0], 1)?,
        "output_padding not below the stride"
    );
    assert!(
        bad([2, 1, 2, 2], [1, 1], [0, 0], 3)?,
        "groups that do not divide"
    );
    Ok(())
}

test_device!(
    transposed_convolution_matches_its_definition_and_finite_differences,
    transposed_convolution
);

/// A small CNN built from the layers (convolution, batch norm, relu, pooling, dropout,
/// linear) learns a task it can only solve from its inputs' layout: whether a bright pixel is
/// in the left or the right half of a 6×6 image. AdamW, cross-entropy, 20 steps.
fn small_cnn_learns(dev: &Device) -> Result<()> {
    use strata::nn::{
        AdamW, BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, Module, Optimizer, Relu,
        Sequential,
    };

    let mut g = Generator::new(5);
    let mut net = Sequential::new()
        .layer(Conv2d::new(
            1,
            4,
            [3, 3],
            [1, 1],
            [1, 1],
            DType::F32,
            &mut g,
            dev,
        )?)
        .layer(BatchNorm2d::new(4, DType::F32, dev)?)
        .layer(Relu)
        .layer(MaxPool2d::new([2, 2]))
        .layer(Flatten)
        .layer(Dropout::new(0.1, Generator::new(9)))
        .layer(Linear::new(4 * 3 * 3, 2, true, DType::F32, &mut g, dev)?);
    assert_eq!(net.parameters().len(), 6);
    let mut opt = AdamW::new(net.parameters(), 0.1)?;
    // 64 images, one bright pixel each; class 1 when it is in the right half.
    let batch = 32;
    let mut images = vec![0.0f32; batch * 36];
    let mut labels = vec![0i64; batch];
    for b in 0..batch {
        let at = (b * 17 + 5) % 36;
        images[b * 36 + at] = 1.0;
        labels[b] = i64::from(at % 6 >= 3);
    }
    let x = Tensor::from_slice(&images, [batch, 1, 6, 6], dev)?;
    let y = Tensor::from_slice(&labels, [batch], dev)?;
    let mut first = None;
    for _ in 0..20 {
        let loss = cross_entropy(&net.forward(&x)?, &y, 0.0, Reduction::Mean)?;
        first.get_or_insert(loss.item::<f32>()?);
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
    }
    net.train(false);
    let scores = net.forward(&x)?.to_vec::<f32>()?;
    let right = (0..batch)
        .filter(|&b| i64::from(scores[2 * b + 1] > scores[2 * b]) == labels[b])
        .count();
    let last = cross_entropy(&net.forward(&x)?, &y, 0.0, Reduction::Mean)?.item::<f32>()?;
    assert!(
        right * 10 >= batch * 9,
        "{right} of {batch} right (loss {first:?} → {last})"
    );
    Ok(())
}

test_device!(a_small_cnn_from_the_layers_learns, small_cnn_learns);

/// Tensors of every dtype through a safetensors file and back; a network's parameters saved
/// and loaded into another of the same layers (then both compute the same), and refused by a
/// network of other shapes.
fn safetensors_round_trip(dev: &Device) -> Result<()> {
    use strata::nn::{
        load_parameters, load_tensors, save_parameters, save_tensors, Linear, Module, Relu,
        Sequential,
    };
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "strata-test-{}-{}.safetensors",
        std::process::id(),
        dev.name().len()
    ));
    let tensors: Vec<(String, Tensor)> = strata_tests::dtypes()
        .into_iter()
        .filter(|&d| dev.backend().check_dtype(d).is_ok())
        .map(|d| {
            let t = Tensor::arange(0, 6, 1, DType::I64, dev)?
                .to_dtype(d)?
                .reshape([3, 2])?;
            Ok((d.to_string(), t.t()?)) // a transposed view: written as its values
        })
        .collect::<Result<_>>()?;
    let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    save_tensors(&path, &named)?;
    let loaded = load_tensors(&path, dev)?;
    assert_eq!(loaded.len(), tensors.len());
    for (name, t) in &tensors {
        let (_, back) = loaded
            .iter()
            .find(|(n, _)| n == name)
            .expect("every name comes back");
        assert_eq!(
            (back.shape(), back.dtype()),
            (t.shape(), t.dtype()),
            "{name}"
        );
        assert_eq!(values(back)?, values(t)?, "{name}");
    }
    assert!(save_tensors(&path, &[("a", &tensors[0].1), ("a", &tensors[0].1)]).is_err());

    let net = |seed| -> Result<Sequential> {
        let mut g = Generator::new(seed);
        Ok(Sequential::new()
            .layer(Linear::new(3, 4, true, DType::F32, &mut g, dev)?)
            .layer(Relu)
            .layer(Linear::new(4, 2, false, DType::F32, &mut g, dev)?))
    };
    let (a, b) = (net(1)?, net(2)?);
    let x = Tensor::randn([5, 3], DType::F32, &mut Generator::new(3), dev)?;
    assert_ne!(
        a.forward(&x)?.to_vec::<f32>()?,
        b.forward(&x)?.to_vec::<f32>()?
    );
    save_parameters(&a, &path)?;
    load_parameters(&b, &path)?;
    assert_eq!(
        a.forward(&x)?.to_vec::<f32>()?,
        b.forward(&x)?.to_vec::<f32>()?
    );
    let other = Sequential::new().layer(Linear::new(
        3,
        5,
        true,
        DType::F32,
        &mut Generator::new(4),
        dev,
    )?);
    let before = other.parameters()[0].to_vec::<f32>()?;
    assert!(load_parameters(&other, &path).is_err());
    assert_eq!(
        other.parameters()[0].to_vec::<f32>()?,
        before,
        "a refused load writes nothing"
    );
    std::fs::remove_file(&path).ok();
    assert!(load_tensors(&path, dev).is_err());
    Ok(())
}

test_device!(
    safetensors_files_round_trip_tensors_and_parameters,
    safetensors_round_trip
);
