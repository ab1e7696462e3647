//! Profiles two streams working at once and writes the timeline and a Chrome trace:
//! `cargo run --example profile -- [cpu|cuda|wgpu] [out-dir]`.

use strata::prelude::*;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dev = Device::parse(args.get(1).map_or("cpu", String::as_str))?;
    let out = std::path::PathBuf::from(args.get(2).map_or("target/profile", String::as_str));
    let n = if dev.kind() == strata::BackendKind::Cuda {
        1 << 24
    } else {
        1 << 18
    };
    let host: Vec<f32> = (0..n).map(|i| i as f32 * 1e-6).collect();
    let (s1, s2) = (dev.new_stream()?, dev.new_stream()?);
    let profile = dev.profile(|| {
        let a = dev.with_stream(&s1, || Tensor::from_slice(&host, [n], &dev))??;
        let b = dev.with_stream(&s2, || Tensor::ones([n], DType::F32, &dev))??;
        let x = dev.with_stream(&s1, || (&a * 2.0)?.exp()?.sum(Axes::All, false))??;
        let y = dev.with_stream(&s2, || (&b + 1.0)?.sqrt()?.sum(Axes::All, false))??;
        let ready = s1.record_event()?;
        s2.wait_event(&ready)?;
        let z = dev.with_stream(&s2, || &x + &y)??;
        println!("result {}", z.item::<f32>()?);
        Ok(())
    })?;
    println!("{profile}");
    std::fs::create_dir_all(&out).map_err(|e| Error::Invalid(e.to_string()))?;
    std::fs::write(out.join("timeline.svg"), profile.timeline_svg().as_str())
        .map_err(|e| Error::Invalid(e.to_string()))?;
    profile.save_chrome_trace(out.join("trace.json"))?;
    println!("wrote {}/timeline.svg and trace.json", out.display());
    Ok(())
}
