//! Makes and checks the shipped kernel archive (`cuda-backend/shipped/`, see
//! `strata_cuda::shipped`): the machine code of the kernels common notebook work launches
//! first, so a new process's first calls load them instead of waiting for NVRTC.
//!
//! - `ship_kernels record DIR` (on a GPU): runs the common work ([`common_work`]) with
//!   `STRATA_CUDA_RECORD=DIR`, which writes each kernel's source into DIR.
//! - `ship_kernels build DIR OUT` (NVRTC, no GPU needed): compiles them for the common
//!   architectures into `OUT/kernels.bin` and its listing `OUT/kernels.txt`.
//! - `ship_kernels check` (on a GPU, empty caches): runs the common work once more and prints
//!   each first call's milliseconds and how many NVRTC compiles it needed (0 when the archive
//!   is current).
//!
//! On the GPU machine, `bash scripts/gpu-run.sh ship` records and builds (into
//! `$OUT/shipped`; copy `kernels.bin` and `kernels.txt` into `cuda-backend/shipped/` and
//! rebuild), and `bash scripts/gpu-run.sh ship-check` checks.

use std::time::Instant;
use strata::prelude::*;

/// The architectures the archive holds: A100, RTX 30, RTX 40 / L4 / L40, H100 / H200,
/// B200, RTX 50.
const ARCHS: [(i32, i32); 6] = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)];

type Work<'a> = (String, Box<dyn Fn() -> Result<Tensor> + 'a>);

/// The common work: what a notebook's first cells launch, over small shapes of each layout
/// class (a vector, rows, a short row, a middle axis, a tall matrix), in f32 unless said.
fn common_work(dev: &Device) -> Result<Vec<Work<'static>>> {
    let mut work: Vec<Work> = Vec::new();
    let shapes: [&[usize]; 5] = [&[1000], &[256, 1000], &[4, 5], &[3, 4, 5], &[1000, 256]];
    for dims in shapes {
        let n: usize = dims.iter().product();
        let x = Tensor::arange(0.0, n as f64, 1.0, DType::F32, dev)?
            .reshape(dims.to_vec())?
            .mul(1e-3)?;
        let tag = format!("{dims:?}");
        let mut axes: Vec<isize> = (0..dims.len() as isize).collect();
        if dims.len() > 1 {
            axes.push(-1);
        }
        let all = |name: &str, f: fn(&Tensor) -> Result<Tensor>, x: &Tensor| -> Work<'static> {
            let x = x.clone();
            (format!("{name} {tag}"), Box::new(move || f(&x)))
        };
        work.push(all("sum", |x| x.sum(Axes::All, false), &x));
        work.push(all("mean", |x| x.mean(Axes::All, false), &x));
        work.push(all("max", |x| x.max(Axes::All, false), &x));
        work.push(all("min", |x| x.min(Axes::All, false), &x));
        work.push(all("argmax", |x| x.argmax(None, false), &x));
        work.push(all("argmin", |x| x.argmin(None, false), &x));
        work.push(all("(a*a).sum()", |x| (x * x)?.sum(Axes::All, false), &x));
        work.push(all("std", |x| x.std(Axes::All, 1, false), &x));
        // Two inputs mapped then reduced (a dot product, a squared error).
        let y = (&x * 0.5)?.add(1.0)?;
        y.realize()?;
        let two = |name: &str, f: fn(&Tensor, &Tensor) -> Result<Tensor>| -> Work<'static> {
            let (x, y) = (x.clone(), y.clone());
            (format!("{name} {tag}"), Box::new(move || f(&x, &y)))
        };
        work.push(two("(a*b).sum()", |a, b| (a * b)?.sum(Axes::All, false)));
        work.push(two("((a-b)^2).mean()", |a, b| {
            (a - b)?.square()?.mean(Axes::All, false)
        }));
        work.push(two("(a-b).abs().mean()", |a, b| {
            (a - b)?.abs()?.mean(Axes::All, false)
        }));
        for axis in axes {
            let (a, b) = (x.clone(), y.clone());
            work.push((
                format!("(a*b).sum axis {axis} {tag}"),
                Box::new(move || (&a * &b)?.sum(axis, false)),
            ));
            let x = x.clone();
            let at = format!("axis {axis} {tag}");
            type AxisOp = fn(&Tensor, isize) -> Result<Tensor>;
            let ops: [(&str, AxisOp); 14] = [
                ("sum", |x, a| x.sum(a, false)),
                ("sum keepdim", |x, a| x.sum(a, true)),
                ("mean", |x, a| x.mean(a, false)),
                ("max", |x, a| x.max(a, false)),
                ("min", |x, a| x.min(a, false)),
                ("argmax", |x, a| x.argmax(Some(a), false)),
                ("argmin", |x, a| x.argmin(Some(a), false)),
                ("var", |x, a| x.var(a, 1, false)),
                ("logsumexp", |x, a| x.logsumexp(a, false)),
                ("softmax", |x, a| x.softmax(a)),
                ("log_softmax", |x, a| x.log_softmax(a)),
                ("softmax from primitives", |x, a| {
                    let e = x.sub(&x.max(a, true)?)?.exp()?;
                    e.div(&e.sum(a, true)?)
                }),
                ("x / x.sum(keepdim)", |x, a| x.div(&x.sum(a, true)?)),
                ("layer-norm from primitives", |x, a| {
                    let c = x.sub(&x.mean(a, true)?)?;
                    c.div(&(&c * &c)?.mean(a, true)?.add(1e-5)?.sqrt()?)
                }),
            ];
            for (name, f) in ops {
                let x = x.clone();
                work.push((format!("{name} {at}"), Box::new(move || f(&x, axis))));
            }
        }
        for to in [DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64] {
            let (a, y) = (x.clone(), x.to_dtype(to)?);
            work.push((
                format!("cast f32 to {to:?} {tag}"),
                Box::new(move || a.to_dtype(to)),
            ));
            work.push((
                format!("cast {to:?} to f32 {tag}"),
                Box::new(move || y.to_dtype(DType::F32)),
            ));
        }
        let (a, b) = (x.clone(), x.clone());
        work.push((format!("x > 0.5 {tag}"), Box::new(move || a.gt(0.5))));
        work.push((
            format!("where(x > 0.5, x, 0) {tag}"),
            Box::new(move || Tensor::where_cond(&b.gt(0.5)?, &b, 0.0)),
        ));
        let h = x.to_dtype(DType::F16)?;
        work.push((
            format!("f16 a*b+a {tag}"),
            Box::new(move || (&h * &h)?.add(&h)),
        ));
        if dims.len() == 2 {
            let (a, b, c) = (x.clone(), x.clone(), x.clone());
            work.push((
                format!("transpose contiguous {tag}"),
                Box::new(move || a.transpose(0, 1)?.contiguous()),
            ));
            work.push((
                format!("cat axis 1 {tag}"),
                Box::new(move || Tensor::cat(&[&b, &b], 1)),
            ));
            let rows = Tensor::from_slice(&[3i64, 0, 1, 2], [4], dev)?;
            let cols = Tensor::from_slice(&[4i64, 0, 2], [3], dev)?;
            let (x0, x1) = (c.clone(), c.clone());
            work.push((
                format!("index_select axis 0 {tag}"),
                Box::new(move || x0.index_select(0, &rows)),
            ));
            work.push((
                format!("index_select axis 1 {tag}"),
                Box::new(move || x1.index_select(1, &cols)),
            ));
            let index = Tensor::zeros(dims.to_vec(), DType::I64, dev)?;
            work.push((
                format!("gather axis 1 {tag}"),
                Box::new(move || c.gather(1, &index)),
            ));
        }
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let d = dev.clone();
        work.push((
            format!("randn {dtype:?}"),
            Box::new(move || {
                let mut g = strata::random::Generator::new(3);
                Tensor::randn([256, 1000], dtype, &mut g, &d)
            }),
        ));
        let d = dev.clone();
        work.push((
            format!("rand {dtype:?}"),
            Box::new(move || {
                let mut g = strata::random::Generator::new(3);
                Tensor::rand([256, 1000], dtype, &mut g, &d)
            }),
        ));
    }
    for dtype in [DType::I64, DType::I32] {
        let d = dev.clone();
        work.push((
            format!("randint {dtype:?}"),
            Box::new(move || {
                let mut g = strata::random::Generator::new(3);
                Tensor::randint(0, 10, [256, 1000], dtype, &mut g, &d)
            }),
        ));
    }
    for dtype in [DType::F32, DType::I64] {
        let d = dev.clone();
        work.push((
            format!("arange {dtype:?}"),
            Box::new(move || Tensor::arange(0, 1000, 1, dtype, &d)),
        ));
    }
    Ok(work)
}

/// Runs `work` three times each (the third after the background compiles of the second),
/// each call realized and synchronized; the first calls' milliseconds.
fn run(dev: &Device, work: &[Work], calls: usize) -> Result<Vec<f64>> {
    let mut first = Vec::new();
    for (name, f) in work {
        for call in 0..calls {
            dev.synchronize()?;
            let t = Instant::now();
            f().and_then(|t| t.realize())
                .map_err(|e| strata::Error::Backend(format!("{name}: {e}")))?;
            dev.synchronize()?;
            if call == 0 {
                first.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok(first)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ship_kernels record DIR | build DIR OUT | check";
    match args.first().map(String::as_str) {
        Some("record") => {
            let dir = args
                .get(1)
                .ok_or_else(|| strata::Error::Invalid(usage.into()))?;
            // Every kernel compiled as a first call would compile it (no caches, no archive),
            // and recorded as it is loaded.
            std::env::set_var("STRATA_CUDA_RECORD", dir);
            std::env::set_var("STRATA_CUDA_SHIPPED", "0");
            std::env::set_var("STRATA_CACHE_DIR", "off");
            let dev = Device::cuda(0)?;
            let work = common_work(&dev)?;
            run(&dev, &work, 3)?;
            // The background compiles queued by the last calls.
            let count = || std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
            let mut seen = count();
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3));
                if count() == seen {
                    break;
                }
                seen = count();
            }
            println!(
                "recorded {seen} programs from {} calls into {dir}",
                work.len()
            );
        }
        Some("build") => {
            let (Some(dir), Some(out)) = (args.get(1), args.get(2)) else {
                return Err(strata::Error::Invalid(usage.into()));
            };
            let (archive, listing) =
                strata_cuda::shipped::build_archive(std::path::Path::new(dir), &ARCHS)?;
            let (major, minor) = strata_cuda::nvrtc_version()?;
            let head = format!(
                "# strata's shipped kernels: built by `ship_kernels build` (NVRTC {major}.{minor}) \
                 from the sources `ship_kernels record` wrote on a GPU; regenerate with \
                 `bash scripts/gpu-run.sh ship` on the GPU machine.\n# arch key name optimization bytes\n"
            );
            let io = |e: std::io::Error| strata::Error::Backend(format!("{out}: {e}"));
            std::fs::create_dir_all(out).map_err(io)?;
            std::fs::write(format!("{out}/kernels.bin"), &archive).map_err(io)?;
            std::fs::write(format!("{out}/kernels.txt"), head + &listing).map_err(io)?;
            println!(
                "{} entries, {} bytes, into {out}",
                listing.lines().count(),
                archive.len()
            );
        }
        Some("check") => {
            let dev = Device::cuda(0)?;
            let work = common_work(&dev)?;
            let before = strata_cuda::shipped::nvrtc_compiles();
            let t = Instant::now();
            let first = run(&dev, &work, 1)?;
            let total = t.elapsed().as_secs_f64() * 1e3;
            let compiles = strata_cuda::shipped::nvrtc_compiles() - before;
            let mut sorted = first.clone();
            sorted.sort_by(f64::total_cmp);
            let worst = work
                .iter()
                .zip(&first)
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(w, ms)| format!("{} {ms:.1}", w.0))
                .unwrap_or_default();
            println!(
                "{{\"op\": \"ship-check\", \"calls\": {}, \"nvrtc_compiles\": {compiles}, \
                 \"total_ms\": {total:.1}, \"median_first_ms\": {:.2}, \"max_first\": \"{worst}\"}}",
                work.len(),
                sorted[sorted.len() / 2]
            );
            for (w, ms) in work.iter().zip(&first) {
                println!("{ms:8.2} ms  {}", w.0);
            }
        }
        _ => return Err(strata::Error::Invalid(usage.into())),
    }
    Ok(())
}
