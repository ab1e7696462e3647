//! The GPU benchmark of the CUDA and wgpu backends (run by `scripts/gpu-run.sh` on the GPU
//! machine beside `scripts/bench_torch.py`, which measures PyTorch the same way in the same run).
//!
//! `bench_gpu [--device cuda|wgpu] [--log2n N] [--gemm K]` prints one JSON object per line:
//! `op`, median `ms` of 20 timed repetitions (stream events around each: CUDA events, or wgpu
//! timestamp queries), and the `bytes` moved or `flops` done, so the caller computes GB/s and
//! TFLOP/s. Defaults: CUDA, 2^28 f32 elements, sgemm 4096³ (smaller sizes suit lavapipe).
//! `bench_gpu first-op` prints the latency of a new process's first add on CUDA (context,
//! kernel compile or PTX-cache load, launch, read back), of its first new fused kernels, and
//! of three calls of a new kernel over 2^26 elements (`large_calls_ms`);
//! `bench_gpu host` only the host cost of tiny ops on CUDA; `bench_gpu mlp [--batch N]
//! [--device cuda|wgpu|cpu]` a GELU MLP's training step (`scripts/bench_mlp_torch.py` is
//! PyTorch's side); `bench_gpu backward [--log2n N] [--device ..]` the backward of the fused
//! chains (`scripts/bench_backward_torch.py`); `bench_gpu peer [--log2n N]` copies between
//! CUDA devices 0 and 1 (`scripts/bench_peer_torch.py`); `bench_gpu conv` conv2d on ResNet-50
//! shapes (`scripts/bench_conv_torch.py`); `bench_gpu cnn [--batch N] [--device ..]` a small
//! ResNet-style CNN's AdamW training step (`cnn.rs`; `scripts/bench_cnn_torch.py`);
//! `bench_gpu dp [--batch N]` that step data-parallel over 1, 2 and every CUDA device;
//! `bench_gpu norms [--device ..]` `layer_norm`, `batch_norm` and `linear` + bias + ReLU,
//! forward and backward (`scripts/bench_norms_torch.py`).
//!
//! Lazy fusion defers elementwise ops until their value is needed, and a result dropped unread
//! never runs: every timed op here realizes its result (`keep`) so each row measures the
//! kernels it names. Rows marked `fused` run with fusion on (the default), rows marked `eager`
//! with `Device::set_fusion(false)`.

#[path = "../bench_common/mod.rs"]
mod bench_common;
mod cnn;

use bench_common::{arg, median};
use std::time::Instant;
use strata::nn::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use strata::ops::Axes;
use strata::prelude::*;

/// Median milliseconds of `op` over 20 repetitions of `inner` calls each, timed with events.
fn time(dev: &Device, inner: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        op()?;
    }
    // Under the profiler every kernel is compiled at its own level first (on CUDA a new kernel
    // runs interpreted or quickly compiled while that compile is in the background).
    dev.profile(&mut op)?;
    dev.synchronize()?;
    let s = dev.current_stream();
    let mut runs = Vec::new();
    for _ in 0..20 {
        let start = s.record_event()?;
        for _ in 0..inner {
            op()?;
        }
        let end = s.record_event()?;
        end.synchronize()?;
        runs.push(start.elapsed_ms(&end)? / inner as f64);
    }
    Ok(median(runs))
}

/// Median microseconds per call of `op` enqueued in bursts of 200 (fewer than a launch queue
/// holds, so the device never holds the host back), over 50 bursts with a sync between them.
/// Each burst ends with an event recorded on the stream, inside the timed span, so work a
/// backend holds back (the CUDA backend's launch batches) is sent before the clock stops.
fn burst_us(dev: &Device, op: impl FnMut() -> Result<()>) -> Result<f64> {
    bursts_us(dev, 50, op)
}

/// [`burst_us`] over `count` bursts.
fn bursts_us(dev: &Device, count: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    let burst = 200;
    let mut bursts = Vec::new();
    for _ in 0..count {
        let t = Instant::now();
        for _ in 0..burst {
            op()?;
        }
        let end = dev.current_stream().record_event()?;
        bursts.push(t.elapsed().as_secs_f64() * 1e6 / burst as f64);
        end.synchronize()?;
    }
    Ok(median(bursts))
}

/// Host cost per op (see `burst_us`) of one-element adds, and of adds alternating with
/// multiplies (each switch of kernel sends the CUDA backend's batch); then the sustained rate
/// of 20,000 adds and one sync, which the GPU's own per-op time bounds; then where the cost
/// goes: the add into an existing output (no allocation), and the add on the CPU device
/// (core's shape, promotion and launch work plus a one-element CPU kernel).
fn host_costs(dev: &Device) -> Result<()> {
    let one = Tensor::ones([1], DType::F32, dev)?;
    for _ in 0..1000 {
        keep(&one + &one)?;
    }
    keep(&one * &one)?;
    keep(&one * &one)?;
    // The profiler compiles the kernels' batched forms (else compiled in the background).
    dev.profile(|| {
        keep(&one + &one)?;
        keep(&one * &one)
    })?;
    dev.synchronize()?;
    // Each add realized at once: recording, then its own one-op kernel.
    let us = burst_us(dev, || keep(&one + &one))?;
    let mut flip = false;
    let alternating = burst_us(dev, || {
        flip = !flip;
        keep(if flip { &one + &one } else { &one * &one })
    })?;
    // Recording with its flushes: a chain of 200 adds, run at the node limit and by the event
    // that ends each burst (its fused kernels' lookups and launches are in the timed span).
    let mut chain = one.clone();
    let recorded = burst_us(dev, || {
        chain = (&chain + &one)?;
        Ok(())
    })?;
    drop(chain);
    // Recording alone (the issue's measure): chains of 50 built and dropped unread, so no
    // kernel runs (a burst ends just as a chain is dropped); the drops, each freeing its
    // pending tree, are in the timed span.
    let mut link = 0;
    let mut chain = one.clone();
    let dropped = burst_us(dev, || {
        link += 1;
        chain = if link % 50 == 0 {
            one.clone()
        } else {
            (&chain + &one)?
        };
        Ok(())
    })?;
    drop(chain);
    let count = 20_000;
    let t = Instant::now();
    for _ in 0..count {
        keep(&one + &one)?;
    }
    dev.synchronize()?;
    let sustained = t.elapsed().as_secs_f64() * 1e6 / count as f64;
    println!(
        "{{\"op\": \"host-us-per-add\", \"us\": {us:.3}, \"sustained_us\": {sustained:.3}, \
         \"alternating_us\": {alternating:.3}, \"recorded_us\": {recorded:.3}, \
         \"recorded_dropped_us\": {dropped:.3}}}"
    );
    // The same adds while a profile records (two events and a record per op): 5 bursts,
    // within the records a profile times on the device.
    let profiler = dev.start_profiling()?;
    let profiled = bursts_us(dev, 5, || keep(&one + &one))?;
    let records = profiler.stop()?.records.len();
    println!("{{\"op\": \"host-profiled\", \"us\": {profiled:.3}, \"records\": {records}}}");
    let out = Tensor::zeros([1], DType::F32, dev)?;
    let into = burst_us(dev, || one.add_out(&one, &out))?;
    let cpu = Device::cpu();
    let one_cpu = Tensor::ones([1], DType::F32, &cpu)?;
    let on_cpu = burst_us(&cpu, || keep(&one_cpu + &one_cpu))?;
    println!(
        "{{\"op\": \"host-parts\", \"add_out_us\": {into:.3}, \"cpu_device_us\": {on_cpu:.3}}}"
    );
    Ok(())
}

/// Runs the deferred work of `t` (lazy fusion) and drops it: what a timed op must do so that
/// the work it names happens inside the timed span.
fn keep(t: Result<Tensor>) -> Result<()> {
    t?.realize()
}

fn row(op: &str, ms: f64, bytes: f64, flops: f64) {
    println!("{{\"op\": \"{op}\", \"ms\": {ms:.6}, \"bytes\": {bytes}, \"flops\": {flops}}}");
}

/// `bench_gpu matmul [--device cuda|wgpu] [--gemm K] [--dtypes f32,f16,bf16,f64]`: K³ products
/// of each dtype (f64 at K/4), and f32 with B transposed (a linear layer's `x · Wᵀ`), one row
/// each with its FLOP count (the device's display names the f16 path).
fn matmuls(dev: &Device, k: usize, dtypes: &[DType]) -> Result<()> {
    eprintln!("device: {}", dev.name());
    for (name, value) in dev.backend().properties() {
        eprintln!("  {name}: {value}");
    }
    let mut g = strata::random::Generator::new(2);
    let x = Tensor::rand([k, k], DType::F32, &mut g, dev)?;
    let y = Tensor::rand([k, k], DType::F32, &mut g, dev)?;
    // (name, A, B, side): each dtype's product, then f32 with B transposed.
    let mut products = Vec::new();
    for &dtype in dtypes {
        let side = if dtype == DType::F64 { k / 4 } else { k };
        let part = |t: &Tensor| t.slice(s![..side, ..side])?.to_dtype(dtype);
        products.push((format!("matmul-{side}-{dtype}"), part(&x)?, part(&y)?, side));
    }
    if dtypes.contains(&DType::F32) {
        products.push((format!("matmul-{k}-f32-bt"), x.clone(), y.t()?, k));
    }
    for (name, a, b, side) in products {
        let ms = time(dev, 1, || keep(a.matmul(&b)))?;
        row(&name, ms, 0.0, 2.0 * (side * side * side) as f64);
    }
    Ok(())
}

fn first_op() -> Result<()> {
    let t0 = Instant::now();
    let dev = Device::cuda(0)?;
    let t1 = Instant::now();
    // The first ops' parts, each synchronized: make a tensor, add, sum, read.
    let mut parts = Vec::new();
    let mut lap = Instant::now();
    let mut part = |dev: &Device| -> Result<()> {
        dev.synchronize()?;
        parts.push(format!("{:.1}", lap.elapsed().as_secs_f64() * 1e3));
        lap = Instant::now();
        Ok(())
    };
    let a = Tensor::ones([1024], DType::F32, &dev)?;
    a.realize()?;
    part(&dev)?;
    let b = (&a + &a)?;
    b.realize()?;
    part(&dev)?;
    let s = b.sum(Axes::All, false)?;
    s.realize()?;
    part(&dev)?;
    let v = s.item::<f32>()?;
    part(&dev)?;
    let parts = parts.join(", ");
    let t2 = Instant::now();
    assert_eq!(v, 2048.0);
    // A fused kernel of a new structure: compile (or PTX-cache load) and launch.
    let f = ((&a * &a)?.add(&a)?.exp()?.sub(&a)?.sqrt()?.mul(0.5)?).to_vec::<f32>()?;
    let t3 = Instant::now();
    assert_eq!(f.len(), 1024);
    // Another new fused kernel under the profiler: how much of a first call is the compile.
    let mut second_ms = 0.0;
    let profile = dev.profile(|| {
        let t = Instant::now();
        ((&a * 3.0)?.tanh()?.add(&a)?.log1p()?).to_vec::<f32>()?;
        second_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(())
    })?;
    let compile_ms: f64 = profile
        .records
        .iter()
        .filter(|r| r.kind == strata::RecordKind::Compile)
        .map(|r| (r.host_end_us - r.host_start_us) / 1e3)
        .sum();
    // A new kernel over 2^26 elements, three calls: on CUDA the first two run through the
    // interpreter (the second leaves the kernel's compile to the background thread), the
    // third, 300 ms later, compiled.
    let big = Tensor::ones([1usize << 26], DType::F32, &dev)?;
    let large = three_calls(&dev, || (&big * 2.0)?.sin()?.add(&big)?.sigmoid())?;
    let kinds = first_calls_by_kind(&dev)?;
    println!(
        "{{\"op\": \"first-op\", \"context_ms\": {:.1}, \"first_ops_ms\": {:.1}, \"first_ops_parts_ms\": [{parts}], \
         \"first_fused_ms\": {:.1}, \"second_fused_ms\": {second_ms:.1}, \
         \"second_fused_compile_ms\": {compile_ms:.1}, \"large_calls_ms\": [{:.2}, {:.2}, {:.2}], \
         \"kinds\": {{{kinds}}}}}",
        (t1 - t0).as_secs_f64() * 1e3,
        (t2 - t1).as_secs_f64() * 1e3,
        (t3 - t2).as_secs_f64() * 1e3,
        large[0],
        large[1],
        large[2]
    );
    Ok(())
}

/// The first call of each kernel kind the map interpreter does not run (reductions, softmax,
/// index, casts, half-precision maps, random draws), on small tensors: each kind's first,
/// second and (after 300 ms, for a background compile to end) third call in ms, as JSON
/// members `"kind": [first, second, third]`.
fn first_calls_by_kind(dev: &Device) -> Result<String> {
    let x = Tensor::arange(0.0, 256.0 * 1000.0, 1.0, DType::F32, dev)?
        .reshape([256, 1000])?
        .mul(1e-3)?;
    let rows = Tensor::from_slice(&[3i64, 0, 255, 7], [4], dev)?;
    let h = x.to_dtype(DType::F16)?;
    let y = (&x * 0.5)?.add(1.0)?;
    y.realize()?;
    dev.synchronize()?;
    type Kind<'a> = (&'static str, Box<dyn Fn() -> Result<Tensor> + 'a>);
    let kinds: Vec<Kind> = vec![
        ("sum axis 0", Box::new(|| x.sum(0, false))),
        ("(a*b).sum()", Box::new(|| (&x * &y)?.sum(Axes::All, false))),
        ("max axis -1", Box::new(|| x.max(-1, false))),
        ("argmax axis -1", Box::new(|| x.argmax(Some(-1), false))),
        ("softmax", Box::new(|| x.softmax(-1))),
        ("log_softmax", Box::new(|| x.log_softmax(-1))),
        ("softmax from primitives", Box::new(|| softmax(&x))),
        ("index_select axis 0", Box::new(|| x.index_select(0, &rows))),
        ("cast f32 to bf16", Box::new(|| x.to_dtype(DType::BF16))),
        ("f16 a*b+a", Box::new(|| (&h * &h)?.add(&h))),
        // A fused f16 map no archive holds: the interpreter's first call.
        ("f16 exp(a)*a - a", Box::new(|| h.exp()?.mul(&h)?.sub(&h))),
        (
            "randn",
            Box::new(|| {
                let mut g = strata::random::Generator::new(3);
                Tensor::randn([256, 1000], DType::F32, &mut g, dev)
            }),
        ),
        // Fused reductions no archive holds: on CUDA their first calls run unfused (the map
        // interpreted, then the shipped plain reduction) until their kernel is compiled.
        (
            "new fused sum |(a-b)*a| axis -1",
            Box::new(|| (&x - &y)?.mul(&x)?.abs()?.sum(-1, false)),
        ),
        (
            "new fused softmax of a/2 from primitives",
            Box::new(|| {
                let e = ((&x - &x.max(-1, true)?)? * 0.5)?.exp()?;
                &e / &e.sum(-1, true)?
            }),
        ),
    ];
    let mut members = Vec::new();
    for (name, f) in &kinds {
        let ms = three_calls(dev, f)?;
        members.push(format!(
            "\"{name}\": [{:.2}, {:.2}, {:.2}]",
            ms[0], ms[1], ms[2]
        ));
    }
    Ok(members.join(", "))
}

/// Wall-clock ms of three synchronized calls of `f`, the third 300 ms after the second (time
/// for a background compile to end).
fn three_calls(dev: &Device, f: impl Fn() -> Result<Tensor>) -> Result<[f64; 3]> {
    let mut ms = [0.0f64; 3];
    for (call, m) in ms.iter_mut().enumerate() {
        if call == 2 {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        dev.synchronize()?;
        let t = Instant::now();
        f()?.realize()?;
        dev.synchronize()?;
        *m = t.elapsed().as_secs_f64() * 1e3;
    }
    Ok(ms)
}

/// tanh-GELU written with primitives: `0.5·x·(1 + tanh(0.7978845608·(x + 0.044715·x³)))`.
fn gelu(x: &Tensor) -> Result<Tensor> {
    let inner = (&(&(&(x * x)? * x)? * 0.044715)? + x)?;
    let t = (&inner * 0.7978845608)?.tanh()?.add(1.0)?;
    &(x * 0.5)? * &t
}

/// Softmax along the last axis written with primitives (strata's `softmax` is the same ops).
fn softmax(x: &Tensor) -> Result<Tensor> {
    let e = (x - &x.max(-1, true)?)?.exp()?;
    &e / &e.sum(-1, true)?
}

/// The chains of the lazy-fusion issue, fused (fusion on) and eager (fusion off).
fn fusion_rows(dev: &Device, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<()> {
    let n = a.numel() as f64;
    let side = 1usize << (a.numel().trailing_zeros() / 2);
    let x2 = a.slice(s![..side * side])?.reshape([side, side])?;
    let sm_bytes = 2.0 * 4.0 * (side * side) as f64;
    for fused in [true, false] {
        dev.set_fusion(fused)?;
        let mode = if fused { "fused" } else { "eager" };
        let ms = time(dev, 1, || keep((a * b)?.add(c)?.relu()))?;
        row(&format!("relu(a*b+c) {mode}"), ms, 16.0 * n, 0.0);
        // `a*b` kept as well: at the flush one kernel stores it beside the result.
        let ms = time(dev, 1, || {
            let kept = (a * b)?;
            let y = (&kept + c)?.relu()?;
            dev.flush()?;
            drop((kept, y));
            Ok(())
        })?;
        row(&format!("kept a*b, relu(a*b+c) {mode}"), ms, 20.0 * n, 0.0);
        let ms = time(dev, 1, || keep(gelu(a)))?;
        row(&format!("gelu-primitives {mode}"), ms, 8.0 * n, 0.0);
        let ms = time(dev, 1, || keep((a * b)?.sum(Axes::All, false)))?;
        row(&format!("(a*b).sum() {mode}"), ms, 8.0 * n, 0.0);
        let ms = time(dev, 1, || keep(softmax(&x2)))?;
        row(&format!("softmax-primitives {mode}"), ms, sm_bytes, 0.0);
        let ms = time(dev, 1, || keep(x2.softmax(-1)))?;
        row(&format!("softmax {mode}"), ms, sm_bytes, 0.0);
        let ms = time(dev, 1, || keep(x2.log_softmax(-1)))?;
        row(&format!("log_softmax {mode}"), ms, sm_bytes, 0.0);
    }
    dev.set_fusion(true)
}

/// One training step of a GELU MLP (784 → 4096 → 4096 → 10, batch `batch`, f32 with TF32
/// matmuls, cross-entropy, `optimizer` = `sgd` (lr 0.01) or `adamw` (lr 0.001)): forward,
/// backward, update. Prints the median step time, the step's FLOPs (forward and backward
/// matmuls), and the device's peak allocated bytes over the run.
fn mlp(dev: &Device, batch: usize, optimizer: &str) -> Result<()> {
    dev.set_allow_tf32(true);
    let mut g = strata::random::Generator::new(5);
    let sizes = [784, 4096, 4096, 10];
    let mut params = Vec::new();
    for pair in sizes.windows(2) {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let w = Tensor::randn([fan_in, fan_out], DType::F32, &mut g, dev)?
            .mul(1.0 / (fan_in as f64).sqrt())?
            .requires_grad_(true)?;
        let b = Tensor::zeros([fan_out], DType::F32, dev)?.requires_grad_(true)?;
        params.push((w, b));
    }
    let x = Tensor::randn([batch, 784], DType::F32, &mut g, dev)?;
    let y = Tensor::randint(0, 10, [batch, 1], DType::I64, &mut g, dev)?;
    dev.flush()?;
    let flat = params.iter().flat_map(|(w, b)| [w.clone(), b.clone()]);
    let mut opt: Box<dyn Optimizer> = match optimizer {
        "adamw" => Box::new(AdamW::new(flat, 1e-3)?),
        _ => Box::new(Sgd::new(flat, 0.01)?),
    };
    let mut step = || -> Result<()> {
        let mut h = x.clone();
        for (k, (w, b)) in params.iter().enumerate() {
            h = h.matmul(w)?.add(b)?;
            if k + 1 < params.len() {
                h = h.gelu()?;
            }
        }
        let loss = h
            .log_softmax(-1)?
            .gather(1, &y)?
            .mean(Axes::All, false)?
            .neg()?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    let ms = time(dev, 1, &mut step)?;
    if std::env::args().any(|a| a == "--profile") {
        // One more step under the profiler: its table (every kernel, copy and allocation with
        // its device time) goes to stderr, beside the JSON rows on stdout.
        dev.synchronize()?;
        let profile = dev.profile(&mut step)?;
        eprintln!("{profile}");
    }
    let matmul_flops: usize = sizes.windows(2).map(|p| 2 * batch * p[0] * p[1]).sum();
    let mut name = if optimizer == "adamw" {
        "mlp-adamw"
    } else {
        "mlp"
    }
    .to_string();
    // Rows of other backends name theirs (`mlp-adamw-wgpu-step-8192`), beside CUDA's.
    name.push_str(backend_suffix(dev));
    row(
        &format!("{name}-step-{batch}"),
        ms,
        0.0,
        3.0 * matmul_flops as f64,
    );
    dev.synchronize()?;
    println!(
        "{{\"op\": \"{name}-peak-mib-{batch}\", \"mib\": {:.1}}}",
        dev.memory_stats().peak as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// The backward of the fused-chain benchmark's chains over `n` f32 elements: build the graph,
/// `backward()`, run the leaves' gradients, clear them (so each is written afresh). The
/// forward pass runs its reduction (the loss) and no more: the backward kernel recomputes
/// what it needs. A second row per chain times the backward alone (the loss computed before
/// the clock starts). Bytes are the backward's floor, each leaf read once and each gradient
/// written once (softmax's weights read too). `copy` over `n` gives the bandwidth beside them.
fn backward_chains(dev: &Device, n: usize) -> Result<()> {
    let mut g = strata::random::Generator::new(3);
    let leaf = |g: &mut strata::random::Generator| -> Result<Tensor> {
        Tensor::randn([n], DType::F32, g, dev)?.requires_grad_(true)
    };
    let (a, b, c) = (leaf(&mut g)?, leaf(&mut g)?, leaf(&mut g)?);
    let side = 1usize << (n.trailing_zeros() / 2);
    let x2 = Tensor::randn([side, side], DType::F32, &mut g, dev)?.requires_grad_(true)?;
    let w2 = Tensor::randn([side, side], DType::F32, &mut g, dev)?;
    dev.flush()?;
    let ms = time(dev, 1, || keep(a.copy()))?;
    row("copy", ms, 8.0 * n as f64, 0.0);
    let f = 4.0 * n as f64;
    type Chain<'a> = (
        &'a str,
        f64,
        Vec<&'a Tensor>,
        Box<dyn Fn() -> Result<Tensor> + 'a>,
    );
    let chains: Vec<Chain> = vec![
        (
            "backward relu(a*b+c).sum()",
            6.0 * f,
            vec![&a, &b, &c],
            Box::new(|| (&a * &b)?.add(&c)?.relu()?.sum(Axes::All, false)),
        ),
        (
            "backward gelu(a).sum()",
            2.0 * f,
            vec![&a],
            Box::new(|| a.gelu()?.sum(Axes::All, false)),
        ),
        (
            "backward (a*b).sum()",
            4.0 * f,
            vec![&a, &b],
            Box::new(|| (&a * &b)?.sum(Axes::All, false)),
        ),
        (
            "backward (softmax(x)*w).sum()",
            3.0 * 4.0 * (side * side) as f64,
            vec![&x2],
            Box::new(|| x2.softmax(-1)?.mul(&w2)?.sum(Axes::All, false)),
        ),
    ];
    for (name, bytes, leaves, loss) in &chains {
        let ms = time(dev, 1, || {
            loss()?.backward()?;
            // One flush runs every gradient, so maps that share inputs run as one kernel.
            dev.flush()?;
            for t in leaves {
                t.zero_grad();
            }
            Ok(())
        })?;
        row(name, ms, *bytes, 0.0);
        // The backward alone: the loss computed and the device idle before the clock starts
        // (the row above also times the forward reduction, which reads every leaf once more).
        let mut runs = Vec::new();
        for k in 0..23 {
            let l = loss()?;
            l.realize()?;
            dev.synchronize()?;
            let s = dev.current_stream();
            let start = s.record_event()?;
            l.backward()?;
            dev.flush()?;
            let end = s.record_event()?;
            end.synchronize()?;
            if k >= 3 {
                runs.push(start.elapsed_ms(&end)?);
            }
            for t in leaves {
                t.zero_grad();
            }
        }
        let alone = name.replacen("backward", "backward alone:", 1);
        row(&alone, median(runs), *bytes, 0.0);
    }
    Ok(())
}

/// `bench_gpu norms`: issue 40's normalization and linear rows beside the copy they are
/// measured against (`scripts/bench_norms_torch.py` is PyTorch's side): `layer_norm` over the
/// last axis of [65536, 4096] f32 and training `batch_norm` over [256, 256, 28, 28] (running
/// statistics updated), each with weight and bias, forward and forward + backward (a fixed
/// upstream gradient, gradients of the input, weight and bias); `linear` + bias + ReLU
/// ([8192, 4096] · [4096, 4096]ᵀ, TF32 on) likewise. Bytes: the forward's read and write, and
/// for forward + backward also the backward's two reads (input, upstream gradient) and write.
fn norms(dev: &Device) -> Result<()> {
    use strata::nn::functional::{batch_norm, layer_norm, linear, RunningStats};
    // With `--profile`, one more run of each forward + backward under the profiler: its table
    // (every kernel with its device time) goes to stderr.
    let profiled = |name: &str, step: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        if std::env::args().any(|a| a == "--profile") {
            dev.synchronize()?;
            eprintln!("{name}:\n{}", dev.profile(step)?);
        }
        Ok(())
    };
    let mut g = strata::random::Generator::new(4);
    let mut randn = |shape: &[usize]| Tensor::randn(shape.to_vec(), DType::F32, &mut g, dev);
    let leaf = |t: Tensor| t.requires_grad_(true);
    let x = leaf(randn(&[65536, 4096])?)?;
    let (w, b) = (leaf(randn(&[4096])?)?, leaf(randn(&[4096])?)?);
    let gy = randn(&[65536, 4096])?;
    let n = x.numel() as f64;
    dev.flush()?;
    let ms = time(dev, 1, || keep(x.detach().copy()))?;
    row("copy [65536, 4096]", ms, 8.0 * n, 0.0);
    let ln = || layer_norm(&x, 1, Some(&w), Some(&b), 1e-5);
    let ms = no_grad(|| time(dev, 1, || keep(ln())))?;
    row("layer_norm forward [65536, 4096]", ms, 8.0 * n, 0.0);
    no_grad(|| profiled("layer_norm forward", &mut || keep(ln())))?;
    let mut step = || forward_backward(dev, &ln, &gy, [&x, &w, &b]);
    let ms = time(dev, 1, &mut step)?;
    row(
        "layer_norm forward + backward [65536, 4096]",
        ms,
        20.0 * n,
        0.0,
    );
    profiled("layer_norm forward + backward", &mut step)?;
    drop((x, gy));
    // Softmax over rows a warp's (the eager plan's) and a block's: one staged kernel each.
    for shape in [[65536, 4096], [16384, 16384]] {
        let x = randn(&shape)?;
        let bytes = 8.0 * x.numel() as f64;
        dev.flush()?;
        let ms = time(dev, 1, || keep(softmax(&x)))?;
        row(
            &format!("softmax from primitives {shape:?}"),
            ms,
            bytes,
            0.0,
        );
        let ms = time(dev, 1, || keep(x.softmax(-1)))?;
        row(&format!("softmax {shape:?}"), ms, bytes, 0.0);
    }

    let x = leaf(randn(&[256, 256, 28, 28])?)?;
    let (w, b) = (leaf(randn(&[256])?)?, leaf(randn(&[256])?)?);
    let running = RunningStats {
        mean: Tensor::zeros([256], DType::F32, dev)?,
        var: Tensor::ones([256], DType::F32, dev)?,
        momentum: 0.1,
    };
    let gy = randn(&[256, 256, 28, 28])?;
    let n = x.numel() as f64;
    dev.flush()?;
    let ms = time(dev, 1, || keep(x.detach().copy()))?;
    row("copy [256, 256, 28, 28]", ms, 8.0 * n, 0.0);
    let bn = || batch_norm(&x, Some(&running), Some(&w), Some(&b), true, 1e-5);
    let ms = no_grad(|| time(dev, 1, || keep(bn())))?;
    row(
        "batch_norm training forward [256, 256, 28, 28]",
        ms,
        8.0 * n,
        0.0,
    );
    let mut step = || forward_backward(dev, &bn, &gy, [&x, &w, &b]);
    let ms = time(dev, 1, &mut step)?;
    row(
        "batch_norm training forward + backward [256, 256, 28, 28]",
        ms,
        20.0 * n,
        0.0,
    );
    profiled("batch_norm training forward + backward", &mut step)?;
    drop((x, gy));

    dev.set_allow_tf32(true);
    let x = leaf(randn(&[8192, 4096])?)?;
    let (w, b) = (
        leaf(randn(&[4096, 4096])?.mul(0.015)?)?,
        leaf(randn(&[4096])?)?,
    );
    let gy = randn(&[8192, 4096])?;
    dev.flush()?;
    let flops = 2.0 * 8192.0 * 4096.0 * 4096.0;
    let lin = || linear(&x, &w, Some(&b))?.relu();
    let ms = no_grad(|| time(dev, 1, || keep(lin())))?;
    row(
        "linear + bias + relu forward [8192, 4096]·[4096, 4096]",
        ms,
        0.0,
        flops,
    );
    let ms = time(dev, 1, || forward_backward(dev, &lin, &gy, [&x, &w, &b]))?;
    row(
        "linear + bias + relu forward + backward",
        ms,
        0.0,
        3.0 * flops,
    );
    dev.set_allow_tf32(false);
    Ok(())
}

/// One forward and backward of `forward` with the upstream gradient `gy`, its kernels
/// flushed, then the `leaves`' gradients cleared (`bench_gpu norms`' forward + backward rows).
fn forward_backward(
    dev: &Device,
    forward: &dyn Fn() -> Result<Tensor>,
    gy: &Tensor,
    leaves: [&Tensor; 3],
) -> Result<()> {
    forward()?.backward_with(gy)?;
    dev.flush()?;
    for t in leaves {
        t.zero_grad();
    }
    Ok(())
}

/// Optimizer steps alone over the MLP's parameters (784·4096 + 4096·4096 + 4096·10 weights
/// and their biases, 19.9 M, gradients set once): SGD, SGD with momentum, AdamW, and AdamW on
/// bf16 parameters rounded to nearest and stochastically. Bytes: what each step reads and
/// writes (AdamW: parameter, gradient and two moments read, three written).
fn optimizer_steps(dev: &Device) -> Result<()> {
    let sizes = [784, 4096, 4096, 10];
    let mut g = strata::random::Generator::new(9);
    let make = |dtype: DType, g: &mut strata::random::Generator| -> Result<Vec<Tensor>> {
        let mut params = Vec::new();
        for pair in sizes.windows(2) {
            for shape in [vec![pair[0], pair[1]], vec![pair[1]]] {
                let p = Tensor::randn(shape.clone(), dtype, g, dev)?.requires_grad_(true)?;
                p.set_grad(Some(Tensor::randn(shape, dtype, g, dev)?))?;
                params.push(p);
            }
        }
        Ok(params)
    };
    let count: usize = sizes.windows(2).map(|p| p[0] * p[1] + p[1]).sum();
    let cases: [(&str, DType, f64); 5] = [
        ("sgd", DType::F32, 12.0),
        ("sgd-momentum", DType::F32, 20.0),
        ("adamw", DType::F32, 28.0),
        ("adamw-bf16", DType::BF16, 14.0),
        ("adamw-bf16-stochastic", DType::BF16, 14.0),
    ];
    for (name, dtype, bytes) in cases {
        let params = make(dtype, &mut g)?;
        dev.flush()?;
        let mut opt: Box<dyn Optimizer> = match name {
            "sgd" => Box::new(Sgd::new(params, 1e-3)?),
            "sgd-momentum" => Box::new(Sgd::with(
                params,
                SgdConfig {
                    lr: 1e-3,
                    momentum: 0.9,
                    ..SgdConfig::default()
                },
            )?),
            "adamw-bf16-stochastic" => Box::new(AdamW::with(
                params,
                AdamConfig {
                    stochastic_rounding: Some(strata::random::Generator::new(1)),
                    ..AdamConfig::adamw()
                },
            )?),
            _ => Box::new(AdamW::new(params, 1e-3)?),
        };
        let ms = time(dev, 1, || opt.step())?;
        row(&format!("optim-{name}"), ms, bytes * count as f64, 0.0);
    }
    Ok(())
}

/// Histograms and stochastic rounding on 2^`log2` f32 normals (issue 42's table): histc into
/// 64 and 4096 bins, the exponent histogram (its read-back included), the stochastic and
/// plain casts to bf16, and a copy for the bandwidth floor.
/// `conv2d` on ResNet-50's shapes, batch 64, forward and forward + backward, in f32 (TF32
/// off), f32 with TF32 and bf16 (`scripts/bench_conv_torch.py` is PyTorch's side, cuDNN): on
/// CUDA through cuDNN, or strata's own implicit GEMM with `STRATA_CUDNN=0`; with
/// `--device wgpu` wgpu's implicit GEMM, f32 only (its rows named `-wgpu`).
fn convolutions(dev: &Device) -> Result<()> {
    use strata::nn::functional::conv2d;
    let mut g = strata::random::Generator::new(1);
    // (channels in, out, kernel, size, stride, padding): ResNet-50's shapes, issue 40's list.
    let shapes = [
        (64usize, 64usize, 3usize, 56usize, 1usize, 1usize),
        (256, 64, 1, 56, 1, 0),
        (128, 128, 3, 28, 1, 1),
        (256, 256, 3, 14, 1, 1),
        (512, 512, 3, 7, 1, 1),
        (3, 64, 7, 224, 2, 3),
    ];
    // f32 without TF32 first (the names without a suffix), then with it, then bf16.
    let kinds = [
        (DType::F32, false, ""),
        (DType::F32, true, " tf32"),
        (DType::BF16, false, " bf16"),
    ];
    let cuda = dev.kind() == strata::BackendKind::Cuda;
    for (dtype, tf32, suffix) in kinds.into_iter().take(if cuda { 3 } else { 1 }) {
        dev.set_allow_tf32(tf32);
        for (c, o, k, hw, stride, pad) in shapes {
            let x = Tensor::randn([64, c, hw, hw], DType::F32, &mut g, dev)?
                .to_dtype(dtype)?
                .requires_grad_(true)?;
            let w = Tensor::randn([o, c, k, k], DType::F32, &mut g, dev)?
                .to_dtype(dtype)?
                .requires_grad_(true)?;
            let out = (hw + 2 * pad - k) / stride + 1;
            let flops = 2.0 * (64 * o * out * out * c * k * k) as f64;
            let name = format!(
                "conv2d{} c{c}->{o} {k}x{k} {hw}^2{suffix}",
                backend_suffix(dev)
            );
            let fwd = time(dev, 1, || {
                keep(strata::autograd::no_grad(|| {
                    conv2d(&x, &w, None, [stride; 2], [pad; 2], [1, 1], 1)
                }))
            })?;
            row(&format!("{name} forward"), fwd, 0.0, flops);
            let both = time(dev, 1, || {
                conv2d(&x, &w, None, [stride; 2], [pad; 2], [1, 1], 1)?
                    .sum(Axes::All, false)?
                    .backward()?;
                x.zero_grad();
                w.zero_grad();
                Ok(())
            })?;
            row(&format!("{name} forward+backward"), both, 0.0, 3.0 * flops);
        }
    }
    dev.set_allow_tf32(false);
    Ok(())
}

/// What a row's name gets for a backend other than CUDA (`-wgpu`, `-cpu`).
fn backend_suffix(dev: &Device) -> &'static str {
    match dev.kind() {
        strata::BackendKind::Cuda => "",
        strata::BackendKind::Wgpu => "-wgpu",
        strata::BackendKind::Cpu => "-cpu",
    }
}

/// One training step of the small CNN ([`cnn::Cnn`]: forward, cross-entropy, backward,
/// AdamW, `zero_grad`) over a batch of `batch` 32×32 images, f32 with TF32 convolutions and
/// matmuls (as `scripts/bench_cnn_torch.py` sets PyTorch), and the peak memory of the run.
fn cnn_step(dev: &Device, batch: usize) -> Result<()> {
    dev.set_allow_tf32(true);
    let model = cnn::Cnn::new(7, dev)?;
    let mut g = strata::random::Generator::new(8);
    let x = Tensor::randn([batch, 3, 32, 32], DType::F32, &mut g, dev)?;
    let y = Tensor::randint(0, 10, [batch], DType::I64, &mut g, dev)?;
    let mut opt = AdamW::new(model.parameters(), 1e-3)?;
    dev.synchronize()?;
    let mut step = || -> Result<()> {
        model.loss(&x, &y)?.backward()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    let first = Instant::now();
    step()?;
    dev.synchronize()?;
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    let ms = time(dev, 1, &mut step)?;
    if std::env::args().any(|a| a == "--profile") {
        dev.synchronize()?;
        eprintln!("{}", dev.profile(&mut step)?);
    }
    // The host's share: wall-clock ms until each phase returns (nothing waited for), the
    // device idle at the start of each step.
    let mut phases = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..10 {
        dev.synchronize()?;
        let t = Instant::now();
        let loss = model.loss(&x, &y)?;
        let forward = t.elapsed();
        loss.backward()?;
        let backward = t.elapsed();
        opt.step()?;
        opt.zero_grad();
        let all = t.elapsed();
        for (v, d) in phases
            .iter_mut()
            .zip([forward, backward - forward, all - backward])
        {
            v.push(d.as_secs_f64() * 1e3);
        }
    }
    let [f, b, o] = phases.map(median);
    for (piece, us) in cnn::host_breakdown(dev, batch)? {
        println!("{{\"op\": \"cnn-host-us {piece}\", \"us\": {us:.1}}}");
    }
    println!("{{\"op\": \"cnn-host-ms-{batch}\", \"forward\": {f:.3}, \"backward\": {b:.3}, \"optimizer\": {o:.3}}}");
    let name = format!("cnn{}", backend_suffix(dev));
    row(
        &format!("{name}-step-{batch}"),
        ms,
        0.0,
        3.0 * cnn::Cnn::forward_flops(batch),
    );
    dev.synchronize()?;
    println!(
        "{{\"op\": \"{name}-peak-mib-{batch}\", \"mib\": {:.1}}}",
        dev.memory_stats().peak as f64 / (1 << 20) as f64
    );
    println!("{{\"op\": \"{name}-first-step-{batch}\", \"ms\": {first_ms:.1}}}");
    Ok(())
}

/// `bench_gpu host-threads`: the host cost of small ops (µs per op, bursts of 200 as
/// [`burst_us`]) issued from one thread to cuda:0, then from one thread per GPU to every GPU
/// at once (thread `k` to cuda:k; the slowest thread's median). A cost that grows with the
/// threads is something they share: a lock in strata, the driver or a library.
fn host_threads() -> Result<()> {
    use strata::nn::functional::conv2d;
    type Op = fn(&[Tensor]) -> Result<()>;
    let kinds: [(&str, Op); 6] = [
        ("add", |t| keep(&t[0] + &t[0])),
        ("zeros", |t| {
            keep(Tensor::zeros([256], DType::F32, t[0].device()))
        }),
        ("sum", |t| keep(t[1].sum(Axes::All, false))),
        ("matmul 32", |t| keep(t[1].matmul(&t[1]))),
        ("conv2d", |t| {
            keep(strata::autograd::no_grad(|| {
                conv2d(&t[2], &t[3], None, [1, 1], [1, 1], [1, 1], 1)
            }))
        }),
        ("mul+sum backward", |t| {
            t[4].mul(&t[4])?.sum(Axes::All, false)?.backward()?;
            t[4].zero_grad();
            Ok(())
        }),
    ];
    let count = Device::cuda_count();
    let operands = (0..count)
        .map(|k| {
            let d = Device::cuda(k)?;
            let mut g = strata::random::Generator::new(3);
            Ok(vec![
                Tensor::ones([1], DType::F32, &d)?,
                Tensor::randn([32, 32], DType::F32, &mut g, &d)?,
                Tensor::randn([1, 4, 8, 8], DType::F32, &mut g, &d)?,
                Tensor::randn([4, 4, 3, 3], DType::F32, &mut g, &d)?,
                Tensor::randn([64], DType::F32, &mut g, &d)?.requires_grad_(true)?,
            ])
        })
        .collect::<Result<Vec<_>>>()?;
    for (name, op) in kinds {
        for ops in &operands {
            let d = ops[0].device().clone();
            for _ in 0..300 {
                op(ops)?;
            }
            d.profile(|| op(ops))?;
            d.synchronize()?;
        }
        let alone = bursts_us(operands[0][0].device(), 21, || op(&operands[0]))?;
        let together = std::thread::scope(|s| {
            let handles: Vec<_> = operands
                .iter()
                .map(|ops| s.spawn(move || bursts_us(ops[0].device(), 21, || op(ops))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a host-threads thread panicked"))
                .collect::<Result<Vec<f64>>>()
        })?;
        let slowest = together.iter().cloned().fold(0.0, f64::max);
        println!(
            "{{\"op\": \"host-threads {name}\", \"one_thread_us\": {alone:.2}, \"threads\": {count}, \"per_thread_us\": {slowest:.2}, \"ratio\": {:.2}}}",
            slowest / alone
        );
    }
    Ok(())
}

/// How `bench_gpu dp` issues each device's work.
#[derive(Clone, Copy, PartialEq)]
enum Issue {
    /// Every device's forward and backward from this thread, one after the other.
    OneThread,
    /// Each device's forward and backward from a thread of its own.
    ThreadPerGpu,
    /// One process per GPU (the launcher pattern): this program started once per rank.
    ProcessPerGpu,
}

/// The CNN's training step data-parallel over 2 and every CUDA device
/// ([`strata::nn::DataParallel`], gradients averaged through NCCL): `per_gpu` images on each
/// device (the global batch grows with the devices, as DistributedDataParallel is used), so
/// the speed-up over one GPU is `world · t₁ / t_world` images per second. The step is bound
/// by the host, whose speed drifts by ±15% within a run on the GPU machine, so `t₁` is
/// measured interleaved with `t_world` (see [`dp_steps`]). Also where the step's time goes.
/// `STRATA_DP_CPUS="0,1;8,9"` pins rank k's process to the k-th CPU list (`taskset`);
/// `STRATA_DP_ONLY=processes` runs the process-per-GPU rows alone.
fn data_parallel(per_gpu: usize, how: Issue) -> Result<()> {
    let count = Device::cuda_count();
    let mut worlds = vec![2, count];
    worlds.retain(|&w| w <= count);
    worlds.dedup();
    if std::env::var("STRATA_DP_ONLY").is_ok_and(|m| m == "processes")
        && how != Issue::ProcessPerGpu
    {
        return Ok(());
    }
    for world in worlds {
        let line = if how == Issue::ProcessPerGpu {
            dp_processes(per_gpu, world)?
        } else {
            let devices: Vec<Device> = (0..world).map(Device::cuda).collect::<Result<_>>()?;
            let comm = strata::collective::nccl(&devices)?;
            dp_steps(comm, (0..world).collect(), world, per_gpu, how)?
        };
        let name = match how {
            Issue::OneThread => "one thread",
            Issue::ThreadPerGpu => "thread per GPU",
            Issue::ProcessPerGpu => "process per GPU",
        };
        println!("{{\"op\": \"dp-cnn-step {per_gpu}/GPU on {world} GPUs ({name})\", {line}}}");
    }
    Ok(())
}

/// `world` ranks of `bench_gpu dp-rank`, one process each, started with `RANK`,
/// `WORLD_SIZE` and `STRATA_NCCL_ID` (this process made the id, so it lives until they end:
/// NCCL's bootstrap root runs in it): rank 0's line.
fn dp_processes(per_gpu: usize, world: usize) -> Result<String> {
    let id = strata::collective::nccl_id()?;
    let exe = std::env::current_exe().map_err(|e| Error::Invalid(e.to_string()))?;
    // `STRATA_DP_CPUS="0,1;8,9"` runs rank k on the k-th CPU list.
    let cpus = std::env::var("STRATA_DP_CPUS").unwrap_or_default();
    let cpus: Vec<&str> = cpus.split(';').filter(|c| !c.is_empty()).collect();
    let children = (0..world)
        .map(|rank| {
            let mut command = match cpus.get(rank) {
                Some(list) => {
                    let mut c = std::process::Command::new("taskset");
                    c.args(["-c", list]).arg(&exe);
                    c
                }
                None => std::process::Command::new(&exe),
            };
            command
                .args(["dp-rank", "--batch", &per_gpu.to_string()])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("STRATA_NCCL_ID", &id)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| Error::Invalid(format!("starting rank {rank}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut first = None;
    for (rank, child) in children.into_iter().enumerate() {
        let out = child
            .wait_with_output()
            .map_err(|e| Error::Invalid(format!("rank {rank}: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("dp-rank "))
            .filter(|_| out.status.success())
            .ok_or_else(|| Error::Invalid(format!("rank {rank} failed: {text}")))?;
        first.get_or_insert(line.to_string());
    }
    first.ok_or_else(|| Error::Invalid("no rank ran".into()))
}

/// One rank of [`dp_processes`]: this process's GPU (device `RANK`) joins the communicator
/// the launcher described and prints `dp-rank <line>`.
fn dp_rank(per_gpu: usize) -> Result<()> {
    let number = |name: &str| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (rank, world) = (number("RANK"), number("WORLD_SIZE"));
    let dev = Device::cuda(rank)?;
    let comm = strata::collective::nccl_from_env(&dev)?;
    let line = dp_steps(comm, vec![rank], world, per_gpu, Issue::OneThread)?;
    println!("dp-rank {line}");
    Ok(())
}

/// The CNN over `comm`'s devices, which are the ranks `ranks` of a group of `world`, each
/// with its shard of a batch of `per_gpu · world` images drawn on it with the same seed.
/// Ten rounds, each of five steps of rank 0 alone (the one-GPU step: no averaging, the other
/// ranks waiting) and five data-parallel steps, a barrier (an all-reduce of one element, every
/// device synchronized) before each part; three steps of each first. Returns the medians of
/// both, the speed-up, and the data-parallel step's phases (ms from its start until each
/// returns: every device's forward and backward as issued, the gradients averaged, the
/// optimizers, every device synchronized), as JSON members; the speed-up is the median of
/// the rounds' own (each round's medians), which cancels the host's drift between rounds.
fn dp_steps(
    comm: strata::collective::Communicator,
    ranks: Vec<usize>,
    world: usize,
    per_gpu: usize,
    how: Issue,
) -> Result<String> {
    use strata::collective::ReduceOp;
    use strata::nn::DataParallel;
    let devices = comm.devices().to_vec();
    for d in &devices {
        d.set_allow_tf32(true);
    }
    let reference = cnn::Cnn::new(7, &devices[0])?;
    let dp = DataParallel::new(comm, &reference.parameters())?;
    drop(reference);
    let models = devices
        .iter()
        .enumerate()
        .map(|(k, d)| cnn::Cnn::new(7, d)?.with_parameters(dp.replica(k)))
        .collect::<Result<Vec<_>>>()?;
    let mut opts = (0..devices.len())
        .map(|k| AdamW::new(dp.replica(k).to_vec(), 1e-3))
        .collect::<Result<Vec<_>>>()?;
    let mut shards = Vec::new();
    for (d, &rank) in devices.iter().zip(&ranks) {
        let mut g = strata::random::Generator::new(8);
        let x = Tensor::randn([per_gpu * world, 3, 32, 32], DType::F32, &mut g, d)?;
        let y = Tensor::randint(0, 10, [per_gpu * world], DType::I64, &mut g, d)?;
        let at = rank * per_gpu;
        shards.push((
            x.narrow(0, at, per_gpu)?.copy()?,
            y.narrow(0, at, per_gpu)?.copy()?,
        ));
    }
    let flags = devices
        .iter()
        .map(|d| Tensor::zeros([1], DType::F32, d))
        .collect::<Result<Vec<_>>>()?;
    let barrier = || -> Result<()> {
        dp.communicator().all_reduce(&flags, ReduceOp::Sum)?;
        devices.iter().try_for_each(|d| d.synchronize())
    };
    // Which of this process's devices is rank 0 (the one-GPU step's device), if any.
    let lead = ranks.iter().position(|&r| r == 0);
    let mut step = |alone: bool, marks: &mut [f64; 4]| -> Result<()> {
        let t = Instant::now();
        let backward =
            |k: usize| -> Result<()> { models[k].loss(&shards[k].0, &shards[k].1)?.backward() };
        let mine: Vec<usize> = if alone {
            lead.into_iter().collect()
        } else {
            (0..devices.len()).collect()
        };
        if how == Issue::ThreadPerGpu && mine.len() > 1 {
            std::thread::scope(|s| {
                let handles: Vec<_> = mine.iter().map(|&k| s.spawn(move || backward(k))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a device's backward thread panicked"))
                    .collect::<Result<Vec<()>>>()
            })?;
        } else {
            mine.iter().try_for_each(|&k| backward(k))?;
        }
        marks[0] = t.elapsed().as_secs_f64() * 1e3;
        if !alone {
            dp.average_gradients()?;
        }
        marks[1] = t.elapsed().as_secs_f64() * 1e3;
        for &k in &mine {
            opts[k].step()?;
            opts[k].zero_grad();
        }
        marks[2] = t.elapsed().as_secs_f64() * 1e3;
        for &k in &mine {
            devices[k].synchronize()?;
        }
        marks[3] = t.elapsed().as_secs_f64() * 1e3;
        Ok(())
    };
    let after = std::env::var("STRATA_DP_AFTER").is_ok_and(|v| v == "1");
    let mut one: Vec<f64> = Vec::new();
    let mut all: [Vec<f64>; 4] = Default::default();
    // Each round's speed-up (its medians' ratio): the host's drift cancels within a round.
    let mut ratios = Vec::new();
    for round in 0..11 {
        let (o, a) = (one.len(), all[3].len());
        for alone in [true, false] {
            barrier()?;
            if alone && lead.is_none() {
                continue;
            }
            for _ in 0..if round == 0 { 3 } else { 5 } {
                let mut marks = [0.0; 4];
                if alone || after {
                    // Rank 0's one-GPU step: its hooks must not average (the other ranks are
                    // at the barrier, not in the bucket's all-reduce). With
                    // `STRATA_DP_AFTER=1` the data-parallel step averages after its backward
                    // passes instead of during them.
                    dp.no_sync(|| step(alone, &mut marks))?;
                } else {
                    step(alone, &mut marks)?;
                }
                if round == 0 {
                    continue;
                }
                if alone {
                    one.push(marks[3]);
                } else {
                    for (r, m) in all.iter_mut().zip(marks) {
                        r.push(m);
                    }
                }
            }
        }
        if round > 0 && lead.is_some() {
            let t1 = median(one[o..].to_vec());
            ratios.push(world as f64 * t1 / median(all[3][a..].to_vec()));
        }
    }
    barrier()?;
    // Ranks other than 0 time no one-GPU step.
    let t1 = if one.is_empty() {
        f64::NAN
    } else {
        median(one)
    };
    let speedup = if ratios.is_empty() {
        f64::NAN
    } else {
        median(ratios.clone())
    };
    let [issued, averaged, stepped, synced] = all.map(median);
    let rounds: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    Ok(format!(
        "\"one_gpu_ms\": {t1:.3}, \"ms\": {synced:.3}, \"speedup\": {speedup:.2}, \
         \"rounds\": \"{}\", \"phases\": \"forward+backward issued {issued:.2}, averaged \
         {averaged:.2}, optimizer {stepped:.2}, synchronized {synced:.2}\"",
        rounds.join(" ")
    ))
}

/// Copies of `n` f32 elements between CUDA devices 0 and 1, each way and both ways at once:
/// median wall-clock ms of 20 repetitions (each a copy and both devices synchronized; the
/// copy is ordered on the two devices' streams, so the host clock is the fair one), as
/// `scripts/bench_peer_torch.py` times `t.to('cuda:1')`.
fn peer_copies(n: usize) -> Result<()> {
    if Device::cuda_count() < 2 {
        eprintln!("peer: one CUDA device, nothing to measure");
        return Ok(());
    }
    let (d0, d1) = (Device::cuda(0)?, Device::cuda(1)?);
    let x0 = Tensor::ones([n], DType::F32, &d0)?;
    let x1 = Tensor::ones([n], DType::F32, &d1)?;
    let bytes = n * 4;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let wall = |op: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut runs = Vec::new();
        for k in 0..23 {
            let t = Instant::now();
            op()?;
            d0.synchronize()?;
            d1.synchronize()?;
            if k >= 3 {
                runs.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(median(runs))
    };
    let rows = [
        ("cuda:0 -> cuda:1", bytes),
        ("cuda:1 -> cuda:0", bytes),
        ("both ways at once", 2 * bytes),
    ];
    for (k, (name, moved)) in rows.into_iter().enumerate() {
        let ms = wall(&mut || {
            match k {
                0 => drop(x0.to_device(&d1)?),
                1 => drop(x1.to_device(&d0)?),
                _ => drop((x0.to_device(&d1)?, x1.to_device(&d0)?)),
            }
            Ok(())
        })?;
        println!("{{\"op\": \"peer copy {gib} GiB {name}\", \"ms\": {ms:.4}, \"bytes\": {moved}}}");
    }
    all_reduces(n)
}

/// all_reduce (sum, in place) of `n` f32 through NCCL over 2 GPUs and over all of them: median
/// wall-clock ms of 20 repetitions, each synchronized on every device, and the bus bandwidth
/// as nccl-tests defines it (bytes / time × 2 (devices − 1) / devices).
fn all_reduces(n: usize) -> Result<()> {
    let all: Vec<Device> = (0..Device::cuda_count())
        .map(Device::cuda)
        .collect::<Result<_>>()?;
    let mut worlds = vec![2, all.len()];
    worlds.dedup();
    for world in worlds {
        let devices = &all[..world];
        let comm = match strata::collective::nccl(devices) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("all_reduce: {e}");
                return Ok(());
            }
        };
        let ts: Vec<Tensor> = devices
            .iter()
            .map(|d| Tensor::ones([n], DType::F32, d))
            .collect::<Result<_>>()?;
        let mut runs = Vec::new();
        for k in 0..23 {
            let t = Instant::now();
            comm.all_reduce(&ts, strata::collective::ReduceOp::Sum)?;
            for d in devices {
                d.synchronize()?;
            }
            if k >= 3 {
                runs.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let ms = median(runs);
        let bytes = (n * 4) as f64;
        let bus = bytes / (ms * 1e6) * 2.0 * (world - 1) as f64 / world as f64;
        let gib = bytes / (1u64 << 30) as f64;
        println!("{{\"op\": \"all_reduce {gib} GiB f32 on {world} GPUs\", \"ms\": {ms:.4}, \"bus_gb_s\": {bus:.1}}}");
    }
    Ok(())
}

fn hist(dev: &Device, log2: u32) -> Result<()> {
    let n = 1usize << log2;
    let mut g = strata::random::Generator::new(3);
    let x = Tensor::randn([n], DType::F32, &mut g, dev)?;
    x.realize()?;
    let bytes = (n * 4) as f64;
    let ms = time(dev, 5, || keep(x.to_dtype(DType::F32)))?;
    row(&format!("copy-f32-2^{log2}"), ms, 2.0 * bytes, 0.0);
    for bins in [64, 4096] {
        let ms = time(dev, 5, || keep(x.histc(bins, -4.0, 4.0)))?;
        row(&format!("histc-{bins}-2^{log2}"), ms, bytes, 0.0);
    }
    let ms = time(dev, 5, || x.exponent_histogram().map(|_| ()))?;
    row(&format!("exponent-histogram-2^{log2}"), ms, bytes, 0.0);
    let ms = time(dev, 5, || keep(x.to_dtype(DType::BF16)))?;
    row(&format!("to-bf16-2^{log2}"), ms, 1.5 * bytes, 0.0);
    let ms = time(dev, 5, || keep(x.to_dtype_stochastic(DType::BF16, &mut g)))?;
    row(
        &format!("to-bf16-stochastic-2^{log2}"),
        ms,
        1.5 * bytes,
        0.0,
    );
    Ok(())
}

fn main() -> Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("hist") => {
            let log2: u32 = arg("--log2", "28").parse().unwrap_or(28);
            return hist(&Device::cuda(0)?, log2);
        }
        Some("first-op") => return first_op(),
        Some("conv") => {
            return match arg("--device", "cuda").as_str() {
                "wgpu" => convolutions(&Device::wgpu()?),
                _ => convolutions(&Device::cuda(0)?),
            }
        }
        Some("dp") => {
            let per_gpu: usize = arg("--batch", "256").parse().unwrap_or(256);
            data_parallel(per_gpu, Issue::OneThread)?;
            data_parallel(per_gpu, Issue::ThreadPerGpu)?;
            return data_parallel(per_gpu, Issue::ProcessPerGpu);
        }
        Some("host-threads") => return host_threads(),
        Some("dp-rank") => {
            return dp_rank(arg("--batch", "256").parse().unwrap_or(256));
        }
        Some("peer") => {
            let log2n: u32 = arg("--log2n", "28").parse().unwrap_or(28);
            return peer_copies(1 << log2n);
        }
        Some("host") => return host_costs(&Device::cuda(0)?),
        Some("norms") => {
            return match arg("--device", "cuda").as_str() {
                "wgpu" => norms(&Device::wgpu()?),
                _ => norms(&Device::cuda(0)?),
            }
        }
        Some("matmul") => {
            let k: usize = arg("--gemm", "8192").parse().unwrap_or(8192);
            let dtypes: Vec<DType> = arg("--dtypes", "f32,f16,bf16,f64")
                .split(',')
                .filter_map(|d| DType::ALL.into_iter().find(|t| t.to_string() == d))
                .collect();
            return match arg("--device", "cuda").as_str() {
                "wgpu" => matmuls(&Device::wgpu()?, k, &dtypes),
                _ => matmuls(&Device::cuda(0)?, k, &dtypes),
            };
        }
        Some(mode @ ("mlp" | "optim" | "backward" | "cnn")) => {
            let dev = match arg("--device", "cuda").as_str() {
                "wgpu" => Device::wgpu()?,
                "cpu" => Device::cpu(),
                _ => Device::cuda(0)?,
            };
            if mode == "optim" {
                return optimizer_steps(&dev);
            }
            if mode == "cnn" {
                let batch: usize = arg("--batch", "256").parse().unwrap_or(256);
                return cnn_step(&dev, batch);
            }
            if mode == "backward" {
                let log2n: u32 = arg("--log2n", "28").parse().unwrap_or(28);
                return backward_chains(&dev, 1 << log2n);
            }
            let batch: usize = arg("--batch", "8192").parse().unwrap_or(8192);
            return mlp(&dev, batch, &arg("--optimizer", "sgd"));
        }
        _ => {}
    }
    let cuda = match arg("--device", "cuda").as_str() {
        "cuda" => true,
        "wgpu" => false,
        other => {
            return Err(Error::Invalid(format!(
                "--device {other}: expected cuda or wgpu"
            )))
        }
    };
    let dev = if cuda {
        Device::cuda(0)?
    } else {
        Device::wgpu()?
    };
    eprintln!("device: {}", dev.name());
    let log2n: u32 = arg("--log2n", "28").parse().unwrap_or(28);
    let n = 1usize << log2n;
    let mut g = strata::random::Generator::new(1);
    let a = Tensor::rand([n], DType::F32, &mut g, &dev)?;
    let b = Tensor::rand([n], DType::F32, &mut g, &dev)?;
    let f = 4.0; // bytes per element

    let c = Tensor::rand([n], DType::F32, &mut g, &dev)?;
    dev.flush()?;
    let ms = time(&dev, 1, || keep(a.copy()))?;
    row("copy", ms, 2.0 * f * n as f64, 0.0);
    let ms = time(&dev, 1, || keep(&a + &b))?;
    row("add", ms, 3.0 * f * n as f64, 0.0);
    let ms = time(&dev, 1, || keep(a.sum(Axes::All, false)))?;
    row("sum", ms, f * n as f64, 0.0);
    let a4 = a.reshape([n / 4, 4])?;
    let ms = time(&dev, 1, || keep(a4.sum(-1, false)))?;
    row("sum-inner-4", ms, 1.25 * f * n as f64, 0.0);
    let side = 1usize << (log2n / 2);
    let (at, bs) = (
        a.slice(s![..side * side])?.reshape([side, side])?.t()?,
        b.slice(s![..side * side])?.reshape([side, side])?,
    );
    let ms = time(&dev, 1, || keep(&at + &bs))?;
    row("add-transposed", ms, 3.0 * f * (side * side) as f64, 0.0);
    fusion_rows(&dev, &a, &b, &c)?;

    let k: usize = arg("--gemm", "4096").parse().unwrap_or(4096);
    let mut g = strata::random::Generator::new(2);
    let x = Tensor::rand([k, k], DType::F32, &mut g, &dev)?;
    let y = Tensor::rand([k, k], DType::F32, &mut g, &dev)?;
    let flops = 2.0 * (k * k * k) as f64;
    let ms = time(&dev, 1, || keep(x.matmul(&y)))?;
    row(&format!("sgemm-{k}-fp32"), ms, 0.0, flops);
    if cuda {
        dev.set_allow_tf32(true);
        let ms = time(&dev, 1, || keep(x.matmul(&y)))?;
        row(&format!("sgemm-{k}-tf32"), ms, 0.0, flops);
        dev.set_allow_tf32(false);
    }

    host_costs(&dev)?;
    Ok(())
}
