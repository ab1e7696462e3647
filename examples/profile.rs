//! Profiles two streams working at once and writes the timeline and a Chrome trace:
//! `cargo run --release --example profile -- [cpu|cuda|wgpu] [out-dir]`; with a third
//! argument `softmax`, profiles softmax along the last axis instead (strata's `softmax` and
//! the same from primitives), so each kernel's share of its time shows; with `copies` (CUDA),
//! pinned host↔device copies on one stream beside kernels on another, to show them overlap.

use strata::prelude::*;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dev = Device::parse(args.get(1).map_or("cpu", String::as_str))?;
    let out = std::path::PathBuf::from(args.get(2).map_or("target/profile", String::as_str));
    if args.get(3).map(String::as_str) == Some("softmax") {
        return profile_softmax(&dev);
    }
    if args.get(3).map(String::as_str) == Some("copies") {
        return profile_copies(&dev, &out);
    }
    // Large enough on a GPU that the device, not the host, sets the pace.
    let n = if dev.kind() == strata::BackendKind::Cuda {
        1 << 26
    } else {
        1 << 18
    };
    let host: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 1e-3).collect();
    let a = Tensor::from_slice(&host, [n], &dev)?;
    let b = Tensor::ones([n], DType::F32, &dev)?;
    let (s1, s2) = (dev.new_stream()?, dev.new_stream()?);
    // Four map→sum chains on each stream, then one stream waits for the other's last sum.
    let work = || -> Result<()> {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for k in 0..4 {
            let k = k as f64;
            x.push(dev.with_stream(&s1, || (&a * k)?.exp()?.sum(Axes::All, false))??);
            y.push(dev.with_stream(&s2, || (&b + k)?.sqrt()?.sum(Axes::All, false))??);
        }
        let ready = s1.record_event()?;
        s2.wait_event(&ready)?;
        let z = dev.with_stream(&s2, || &x[3] + &y[3])??;
        println!("result {}", z.item::<f32>()?);
        Ok(())
    };
    // Once before recording: the profile then shows the steady state, without the kernels'
    // first-use compiles and the allocator's first growth.
    work()?;
    let profile = dev.profile(work)?;
    println!("{profile}");
    std::fs::create_dir_all(&out).map_err(|e| Error::Invalid(e.to_string()))?;
    std::fs::write(out.join("timeline.svg"), profile.timeline_svg().as_str())
        .map_err(|e| Error::Invalid(e.to_string()))?;
    profile.save_chrome_trace(out.join("trace.json"))?;
    println!("wrote {}/timeline.svg and trace.json", out.display());
    Ok(())
}

/// Softmax of a [16384, 16384] f32 tensor on a GPU ([256, 1024] on the CPU), profiled after a
/// warm-up call: strata's `softmax`, then the same from primitives.
fn profile_softmax(dev: &Device) -> Result<()> {
    let (rows, cols) = if dev.kind() == strata::BackendKind::Cpu {
        (256, 1024)
    } else {
        (16384, 16384)
    };
    let x = Tensor::rand(
        [rows, cols],
        DType::F32,
        &mut strata::random::Generator::new(0),
        dev,
    )?;
    let primitives = |x: &Tensor| -> Result<Tensor> {
        let e = x.sub(&x.max(-1, true)?)?.exp()?;
        e.div(&e.sum(-1, true)?)
    };
    for (name, f) in [
        (
            "softmax",
            &(|x: &Tensor| x.softmax(-1)) as &dyn Fn(&Tensor) -> Result<Tensor>,
        ),
        ("softmax from primitives", &primitives),
    ] {
        f(&x)?.realize()?;
        dev.synchronize()?;
        let profile = dev.profile(|| {
            f(&x)?.realize()?;
            dev.synchronize()
        })?;
        println!("== {name} of [{rows}, {cols}] f32\n{profile}");
    }
    Ok(())
}

/// Four 256 MiB uploads from pinned memory and four downloads into it on one stream while
/// another stream runs kernels: the copy engine and the SMs work at once (the timeline shows
/// the two lanes overlapping).
fn profile_copies(dev: &Device, out: &std::path::Path) -> Result<()> {
    let host = dev.pinned_host()?;
    let n = 1 << 26;
    let chunks: Vec<Tensor> = (0..4)
        .map(|k| Tensor::full([n], k as f64, DType::F32, &host))
        .collect::<Result<_>>()?;
    let x = Tensor::rand([n], DType::F32, &mut strata::random::Generator::new(0), dev)?;
    let (copy, compute) = (dev.new_stream()?, dev.new_stream()?);
    let work = || -> Result<()> {
        let mut kept = Vec::new();
        for c in &chunks {
            kept.push(dev.with_stream(&copy, || c.to_device(dev))??);
            let y = dev.with_stream(&compute, || (&x * 1.5)?.exp()?.tanh()?.sqrt())??;
            y.realize()?;
            kept.push(dev.with_stream(&copy, || x.to_device(&host))??);
        }
        dev.synchronize()
    };
    work()?;
    let profile = dev.profile(work)?;
    println!("== pinned copies on one stream, kernels on another\n{profile}");
    std::fs::create_dir_all(out).map_err(|e| Error::Invalid(e.to_string()))?;
    std::fs::write(out.join("copies.svg"), profile.timeline_svg().as_str())
        .map_err(|e| Error::Invalid(e.to_string()))?;
    println!("wrote {}/copies.svg", out.display());
    Ok(())
}
