//! Optimizers on every backend against PyTorch's update rules computed here in f64 (SGD with
//! momentum, dampening, Nesterov, weight decay, maximize; Adam and AdamW), on contiguous and
//! transposed parameters: one kernel per parameter, old values seen by pending readers,
//! parameters without gradients skipped, stochastic rounding of bf16 parameters (small updates
//! kept on average, the same bits on every backend), and the errors.

use strata::nn::{Adam, AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use strata::prelude::*;
use strata::RecordKind;
use strata_tests::{test_device, Rng};

fn supports(dev: &Device, dtype: DType) -> bool {
    dev.backend().check_dtype(dtype).is_ok()
}

/// `n` values in [-2, 2) on a grid every float dtype holds exactly.
fn values(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.below(4096) as f64 - 2048.0) / 1024.0)
        .collect()
}

fn tensor(v: &[f64], shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(v, shape, dev)?.to_dtype(dtype)
}

fn read(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

/// A parameter of `shape` holding `v` (row-major): contiguous, or the transpose of a
/// contiguous [cols, rows] leaf, so the step writes a permuted view.
fn parameter(
    v: &[f64],
    shape: [usize; 2],
    transposed: bool,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let p = if transposed {
        let [r, c] = shape;
        let mut t = vec![0.0; v.len()];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = v[i * c + j];
            }
        }
        tensor(&t, &[c, r], dtype, dev)?.t()?
    } else {
        tensor(v, &shape, dtype, dev)?
    };
    p.requires_grad_(true)
}

fn close(got: &[f64], want: &[f64], dtype: DType, what: &str) {
    let tol = if dtype == DType::F64 { 1e-12 } else { 2e-6 };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, PyTorch's rule gives {w}"
        );
    }
}

/// `torch.optim.SGD`'s step, in f64.
fn sgd_reference(p: &mut [f64], g: &[f64], c: &SgdConfig, buf: &mut Option<Vec<f64>>) {
    let mut d: Vec<f64> = g
        .iter()
        .zip(p.iter())
        .map(|(&g, &x)| if c.maximize { -g } else { g } + c.weight_decay * x)
        .collect();
    if c.momentum != 0.0 {
        let b = match buf.take() {
            None => d.clone(),
            Some(b) => b
                .iter()
                .zip(&d)
                .map(|(b, g)| c.momentum * b + (1.0 - c.dampening) * g)
                .collect(),
        };
        d = if c.nesterov {
            d.iter().zip(&b).map(|(g, b)| g + c.momentum * b).collect()
        } else {
            b.clone()
        };
        *buf = Some(b);
    }
    for (x, d) in p.iter_mut().zip(d) {
        *x -= c.lr * d;
    }
}

/// `torch.optim.Adam` / `AdamW`'s step `t` (from 1), in f64.
#[allow(clippy::too_many_arguments)]
fn adam_reference(
    p: &mut [f64],
    g: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    t: i32,
    c: &AdamConfig,
    decoupled: bool,
) {
    let (b1, b2) = c.betas;
    for i in 0..p.len() {
        let mut gi = if c.maximize { -g[i] } else { g[i] };
        if decoupled {
            p[i] *= 1.0 - c.lr * c.weight_decay;
        } else {
            gi += c.weight_decay * p[i];
        }
        m[i] += (1.0 - b1) * (gi - m[i]);
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        let step_size = c.lr / (1.0 - b1.powi(t));
        let denom = v[i].sqrt() / (1.0 - b2.powi(t)).sqrt() + c.eps;
        p[i] -= step_size * m[i] / denom;
    }
}

const SHAPE: [usize; 2] = [5, 7];

fn sgd_follows_pytorch(dev: &Device) -> Result<()> {
    let configs = [
        SgdConfig {
            lr: 0.1,
            ..SgdConfig::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 0.01,
            ..SgdConfig::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.8,
            nesterov: true,
            weight_decay: 0.1,
            ..SgdConfig::default()
        },
        SgdConfig {
            lr: 0.2,
            momentum: 0.5,
            maximize: true,
            ..SgdConfig::default()
        },
    ];
    let mut rng = Rng(11);
    for dtype in [DType::F32, DType::F64]
        .into_iter()
        .filter(|&d| supports(dev, d))
    {
        for (k, c) in configs.iter().enumerate() {
            let transposed = k % 2 == 1;
            let mut want = values(&mut rng, 35);
            let p = parameter(&want, SHAPE, transposed, dtype, dev)?;
            let mut opt = Sgd::with([p.clone()], *c)?;
            let mut buf = None;
            for step in 0..3 {
                let g = values(&mut rng, 35);
                p.set_grad(Some(tensor(&g, &SHAPE, dtype, dev)?))?;
                opt.step()?;
                sgd_reference(&mut want, &g, c, &mut buf);
                let what = format!("SGD config {k}, {dtype}, step {step}");
                close(&read(&p)?, &want, dtype, &what);
                if let Some(b) = &buf {
                    close(&read(opt.momentum_buffer(0).unwrap())?, b, dtype, &what);
                }
            }
        }
    }
    Ok(())
}
test_device!(sgd_follows_pytorchs_rule, sgd_follows_pytorch);

fn adam_follows_pytorch(dev: &Device) -> Result<()> {
    let configs = [
        (
            AdamConfig {
                lr: 0.01,
                ..AdamConfig::default()
            },
            false,
        ),
        (
            AdamConfig {
                lr: 0.02,
                weight_decay: 0.1,
                betas: (0.8, 0.99),
                ..AdamConfig::default()
            },
            false,
        ),
        (
            AdamConfig {
                lr: 0.01,
                ..AdamConfig::adamw()
            },
            true,
        ),
        (
            AdamConfig {
                lr: 0.03,
                weight_decay: 0.2,
                maximize: true,
                eps: 1e-3,
                ..AdamConfig::adamw()
            },
            true,
        ),
    ];
    let mut rng = Rng(12);
    for dtype in [DType::F32, DType::F64]
        .into_iter()
        .filter(|&d| supports(dev, d))
    {
        for (k, (c, decoupled)) in configs.iter().enumerate() {
            let transposed = k % 2 == 0;
            let mut want = values(&mut rng, 35);
            let (mut m, mut v) = (vec![0.0; 35], vec![0.0; 35]);
            let p = parameter(&want, SHAPE, transposed, dtype, dev)?;
            let mut opt: Box<dyn Optimizer> = if *decoupled {
                Box::new(AdamW::with([p.clone()], *c)?)
            } else {
                Box::new(Adam::with([p.clone()], *c)?)
            };
            for t in 1..=3 {
                let g = values(&mut rng, 35);
                p.set_grad(Some(tensor(&g, &SHAPE, dtype, dev)?))?;
                opt.step()?;
                adam_reference(&mut want, &g, &mut m, &mut v, t, c, *decoupled);
                let what = format!("Adam config {k}, {dtype}, step {t}");
                close(&read(&p)?, &want, dtype, &what);
            }
            if !decoupled {
                // The state is inspectable: PyTorch's exp_avg and exp_avg_sq.
                let adam = Adam::with([p.clone()], *c)?;
                assert!(adam.exp_avg(0).is_none());
            }
        }
    }
    // The moments and the step count, read from an Adam after two steps.
    let p = Tensor::from_slice(&[1.0f32, 2.0], [2], dev)?.requires_grad_(true)?;
    let mut opt = Adam::new([p.clone()], 0.1)?;
    for g in [[1.0f32, -2.0], [3.0, 0.5]] {
        p.set_grad(Some(Tensor::from_slice(&g, [2], dev)?))?;
        opt.step()?;
    }
    assert_eq!(opt.steps(0), 2);
    let m = read(opt.exp_avg(0).unwrap())?;
    let v = read(opt.exp_avg_sq(0).unwrap())?;
    close(
        &m,
        &[0.9 * 0.1 + 0.1 * 3.0, 0.9 * -0.2 + 0.1 * 0.5],
        DType::F32,
        "exp_avg",
    );
    close(
        &v,
        &[0.999 * 0.001 + 0.001 * 9.0, 0.999 * 0.004 + 0.001 * 0.25],
        DType::F32,
        "exp_avg_sq",
    );
    Ok(())
}
test_device!(adam_and_adamw_follow_pytorchs_rule, adam_follows_pytorch);

/// Kernels launched by `f`.
fn kernels(dev: &Device, f: impl FnOnce() -> Result<()>) -> Result<usize> {
    let p = dev.profile(f)?;
    Ok(p.device_work()
        .filter(|r| r.kind == RecordKind::Kernel)
        .count())
}

fn one_kernel_per_parameter(dev: &Device) -> Result<()> {
    let a = Tensor::ones([64, 3], DType::F32, dev)?.requires_grad_(true)?;
    let b = Tensor::ones([3], DType::F32, dev)?.requires_grad_(true)?;
    let grads = [
        Tensor::full([64, 3], 0.5, DType::F32, dev)?,
        Tensor::full([3], 0.25, DType::F32, dev)?,
    ];
    let set = || -> Result<()> {
        for (p, g) in [&a, &b].into_iter().zip(&grads) {
            p.set_grad(Some(g.clone()))?;
        }
        Ok(())
    };
    let mut sgd = Sgd::with(
        [a.clone(), b.clone()],
        SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.1,
            ..SgdConfig::default()
        },
    )?;
    let mut adam = AdamW::new([a.clone(), b.clone()], 0.1)?;
    // Where the backend binds fewer tensors a kernel than a step reads and writes (AdamW: 3
    // written, 4 read), each value runs on its own: `write_values`' other path, which
    // `scripts/test.sh` runs with `STRATA_WGPU_MAX_BINDINGS=6`.
    let binds = |n| dev.backend().target().binds(n);
    for _ in 0..2 {
        set()?;
        let n = kernels(dev, || sgd.step())?;
        assert!(
            n == 2 || !binds(5),
            "SGD with momentum and decay: {n} kernels"
        );
        set()?;
        let n = kernels(dev, || adam.step())?;
        assert!(n == 2 || !binds(7), "AdamW: {n} kernels");
    }
    Ok(())
}
test_device!(a_step_is_one_kernel_per_parameter, one_kernel_per_parameter);

/// The profile names a step's kernel by what it computes, not by how the parameter was first
/// made (an existing storage's record of its creation: here `randn` and `mul`).
fn steps_are_named_for_themselves(dev: &Device) -> Result<()> {
    let mut g = Generator::new(4);
    let p = Tensor::randn([64], DType::F32, &mut g, dev)?
        .mul(0.5)?
        .requires_grad_(true)?;
    p.realize()?;
    p.set_grad(Some(Tensor::ones([64], DType::F32, dev)?))?;
    let mut opt = AdamW::new([p.clone()], 0.1)?;
    let profile = dev.profile(|| opt.step())?;
    for r in profile
        .device_work()
        .filter(|r| r.kind == RecordKind::Kernel)
    {
        assert!(
            !r.ops.iter().any(|op| op == "random" || op == "randn"),
            "the step's kernel is named after the parameter's creation: {:?}",
            r.ops
        );
    }
    Ok(())
}
test_device!(
    a_steps_kernel_is_named_for_itself,
    steps_are_named_for_themselves
);

fn steps_see_old_values(dev: &Device) -> Result<()> {
    let p = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], dev)?.requires_grad_(true)?;
    let mut opt = Adam::new([p.clone()], 0.5)?;
    // A pending tree that reads the parameter, and a pending gradient.
    let before = no_grad(|| p.mul(2.0))?;
    let g = Tensor::from_slice(&[1.0f32, -1.0, 0.0], [3], dev)?.mul(4.0)?;
    p.set_grad(Some(g))?;
    opt.step()?;
    assert_eq!(
        before.to_vec::<f32>()?,
        vec![2.0, 4.0, 6.0],
        "the tree saw the old values"
    );
    let got = p.to_vec::<f32>()?;
    // First step: ±lr against the gradient's sign, 0 where the gradient is 0.
    assert!(
        (got[0] - 0.5).abs() < 1e-6 && (got[1] - 2.5).abs() < 1e-6,
        "{got:?}"
    );
    assert_eq!(got[2], 3.0);
    // A parameter without a gradient is left alone, and gets no state.
    let q = Tensor::ones([2], DType::F32, dev)?.requires_grad_(true)?;
    let mut opt = Sgd::with(
        [p.clone(), q.clone()],
        SgdConfig {
            lr: 1.0,
            momentum: 0.9,
            ..SgdConfig::default()
        },
    )?;
    p.set_grad(Some(Tensor::ones([3], DType::F32, dev)?))?;
    opt.step()?;
    assert_eq!(q.to_vec::<f32>()?, vec![1.0, 1.0]);
    assert!(opt.momentum_buffer(1).is_none() && opt.momentum_buffer(0).is_some());
    // A training loop through backward: the loss falls.
    let w = Tensor::from_slice(&[3.0f32, -2.0], [2], dev)?.requires_grad_(true)?;
    let mut opt = AdamW::new([w.clone()], 0.1)?;
    let loss = || w.mul(&w).and_then(|s| s.sum(Axes::All, false));
    let first = loss()?.item::<f32>()?;
    for _ in 0..20 {
        opt.zero_grad();
        loss()?.backward()?;
        opt.step()?;
    }
    assert!(loss()?.item::<f32>()? < first / 2.0);
    Ok(())
}
test_device!(a_step_reads_the_values_before_it, steps_see_old_values);

/// bf16 parameters of ones after `steps` SGD steps of `-step` each (lr 1), rounded as `c` says.
fn bf16_after(dev: &Device, c: SgdConfig, step: f64, steps: usize) -> Result<Vec<f64>> {
    let p = Tensor::ones([4096], DType::BF16, dev)?.requires_grad_(true)?;
    let mut opt = Sgd::with([p.clone()], SgdConfig { lr: 1.0, ..c })?;
    for _ in 0..steps {
        p.set_grad(Some(Tensor::full([4096], step, DType::BF16, dev)?))?;
        opt.step()?;
    }
    read(&p)
}

fn stochastic_rounding(dev: &Device) -> Result<()> {
    if !supports(dev, DType::BF16) {
        return Ok(());
    }
    // 2^-10 is a quarter of bf16's spacing just below 1: rounded to nearest, 1 − 2^-10 is 1
    // again, so every update is lost; rounded stochastically, each survives on average.
    let step = 2f64.powi(-10);
    let nearest = bf16_after(dev, SgdConfig::default(), step, 16)?;
    assert!(nearest.iter().all(|&x| x == 1.0));
    let c = SgdConfig {
        stochastic_rounding: Some(Generator::new(7)),
        ..SgdConfig::default()
    };
    let kept = bf16_after(dev, c, step, 16)?;
    let mean = kept.iter().sum::<f64>() / kept.len() as f64;
    let want = 1.0 - 16.0 * step;
    // Each element's sum of 16 roundings has a standard deviation under 2^-8: the mean of 4096
    // within 2^-11 is past five standard deviations.
    assert!(
        (mean - want).abs() < 2f64.powi(-11),
        "mean {mean}, want {want}"
    );
    // Philox: the same bits as the CPU for the seed.
    let cpu = bf16_after(&Device::cpu(), c, step, 16)?;
    assert_eq!(kept, cpu);
    // Adam with stochastic rounding: the CPU's bits too.
    let adam_bits = |dev: &Device| -> Result<Vec<f64>> {
        let v: Vec<f64> = (0..257).map(|i| 1.0 + i as f64 / 64.0).collect();
        let p = tensor(&v, &[257], DType::BF16, dev)?.requires_grad_(true)?;
        let c = AdamConfig {
            lr: 1e-3,
            stochastic_rounding: Some(Generator::new(3)),
            ..AdamConfig::adamw()
        };
        let mut opt = AdamW::with([p.clone()], c)?;
        for _ in 0..3 {
            p.set_grad(Some(tensor(&v, &[257], DType::BF16, dev)?))?;
            opt.step()?;
        }
        read(&p)
    };
    assert_eq!(adam_bits(dev)?, adam_bits(&Device::cpu())?);
    Ok(())
}
test_device!(stochastic_rounding_keeps_small_updates, stochastic_rounding);

fn errors(dev: &Device) -> Result<()> {
    let ints = Tensor::zeros([2], DType::I32, dev)?;
    let e = Sgd::new([ints], 0.1).unwrap_err().to_string();
    assert!(e.contains("parameter 0 is i32"), "{e}");
    let leaf = Tensor::ones([2], DType::F32, dev)?.requires_grad_(true)?;
    let computed = leaf.mul(2.0)?;
    let e = Adam::new([computed], 0.1).unwrap_err().to_string();
    assert!(
        e.contains("parameter 0") && e.contains("MulBackward"),
        "{e}"
    );
    let e = AdamW::new([leaf.clone(), leaf.clone()], 0.1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("parameters 0 and 1 share one storage"), "{e}");
    let bad = AdamConfig {
        betas: (1.5, 0.9),
        ..AdamConfig::default()
    };
    let e = Adam::with([leaf.clone()], bad).unwrap_err().to_string();
    assert!(e.contains("beta1 1.5"), "{e}");
    let bad = SgdConfig {
        lr: -1.0,
        ..SgdConfig::default()
    };
    assert!(Sgd::with([leaf.clone()], bad)
        .unwrap_err()
        .to_string()
        .contains("learning rate -1"));
    let bad = SgdConfig {
        momentum: 0.9,
        dampening: 0.5,
        nesterov: true,
        ..SgdConfig::default()
    };
    assert!(Sgd::with([leaf], bad)
        .unwrap_err()
        .to_string()
        .contains("Nesterov"));
    Ok(())
}
test_device!(bad_parameters_and_settings_are_errors, errors);
