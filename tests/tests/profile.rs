//! The profiler on every backend: a known sequence gives the right records in order (kinds,
//! ops, byte counts, FLOPs, streams) with device times that make sense; events are markers;
//! the Chrome trace follows the format; `STRATA_PROFILE=1` prints a table at each
//! synchronization.

use strata::prelude::*;
use strata::{Profile, RecordKind, StreamId};
use strata_tests::test_device;

fn work(p: &Profile) -> Vec<(RecordKind, Vec<String>, u64, u64)> {
    p.device_work()
        .map(|r| (r.kind, r.ops.clone(), r.bytes_read, r.bytes_written))
        .collect()
}

fn ops(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn known_sequence(dev: &Device) -> Result<()> {
    let host: Vec<f32> = (0..1024).map(|i| i as f32 - 512.0).collect();
    let mut total = 0.0;
    let p = dev.profile(|| {
        let a = Tensor::from_slice(&host, [1024], dev)?;
        let b = (&a * 2.0)?.relu()?;
        b.realize()?;
        total = b.sum(Axes::All, false)?.item::<f32>()?;
        Ok(())
    })?;
    assert_eq!(total, 2.0 * (1..512).sum::<i32>() as f32);
    let mapped = if dev.fusion() {
        vec![(RecordKind::Kernel, ops(&["mul", "relu"]), 4096, 4096)]
    } else {
        vec![
            (RecordKind::Kernel, ops(&["mul"]), 4096, 4096),
            (RecordKind::Kernel, ops(&["relu"]), 4096, 4096),
        ]
    };
    let mut want = vec![(RecordKind::Upload, vec![], 4096, 4096)];
    want.extend(mapped);
    want.push((RecordKind::Kernel, ops(&["sum"]), 4096, 4));
    want.push((RecordKind::Download, vec![], 4, 4));
    assert_eq!(work(&p), want, "{p}");
    let kernels: Vec<_> = p
        .device_work()
        .filter(|r| r.kind == RecordKind::Kernel)
        .collect();
    assert_eq!(
        kernels.last().unwrap().flops,
        1024,
        "a sum adds each element once"
    );
    if dev.fusion() {
        assert_eq!(kernels[0].flops, 2048, "mul and relu: two per element");
    }
    let allocated: Vec<u64> = p
        .records
        .iter()
        .filter(|r| r.kind == RecordKind::Allocate)
        .map(|r| r.bytes_written)
        .collect();
    assert_eq!(allocated.first(), Some(&4096), "{p}");
    assert_eq!(allocated.last(), Some(&4), "{p}");
    // Issue order on the host, and device order on the one stream.
    let mut last_host = 0.0;
    let mut last_end = 0.0;
    for r in p.device_work() {
        assert!(
            r.host_start_us >= last_host && r.host_end_us >= r.host_start_us,
            "{p}"
        );
        last_host = r.host_start_us;
        let (start, end) = (r.device_start_us.unwrap(), r.device_end_us.unwrap());
        assert!(start <= end && start + 1.0 >= last_end, "{p}");
        last_end = end;
    }
    // Every record is on the default stream, and the table names the device.
    assert_eq!(p.streams(), vec![StreamId::DEFAULT]);
    assert!(p.to_string().contains(&dev.name()));
    assert!(p.copy_bandwidth_gb_per_s.is_some_and(|g| g > 0.0));
    Ok(())
}
test_device!(
    a_known_sequence_lists_its_kernels_and_copies_in_order,
    known_sequence
);

fn broadcast_bytes(dev: &Device) -> Result<()> {
    let col = Tensor::ones([64, 1], DType::F32, dev)?;
    let row = Tensor::ones([1, 64], DType::F32, dev)?;
    let p = dev.profile(|| (&col + &row)?.realize())?;
    let k = p.device_work().next().unwrap();
    assert_eq!(k.ops, ops(&["add"]));
    // A broadcast operand is read once per distinct element: 64 + 64 floats in, 64² out.
    assert_eq!((k.bytes_read, k.bytes_written), (512, 16384));
    assert_eq!(k.flops, 4096);
    Ok(())
}
test_device!(
    broadcast_operands_count_their_distinct_bytes,
    broadcast_bytes
);

fn matmul_flops(dev: &Device) -> Result<()> {
    let a = Tensor::ones([8, 16], DType::F32, dev)?;
    let b = Tensor::ones([16, 4], DType::F32, dev)?;
    let p = dev.profile(|| a.matmul(&b)?.realize())?;
    let k = p
        .device_work()
        .find(|r| r.ops == ops(&["matmul"]))
        .expect("a matmul kernel");
    assert_eq!(k.flops, 2 * 8 * 4 * 16);
    assert_eq!((k.bytes_read, k.bytes_written), (4 * (128 + 64), 4 * 32));
    Ok(())
}
test_device!(a_matmul_counts_two_flops_per_multiply_add, matmul_flops);

fn streams_and_events(dev: &Device) -> Result<()> {
    let (s1, s2) = (dev.new_stream()?, dev.new_stream()?);
    let p = dev.profile(|| {
        let a = dev.with_stream(&s1, || Tensor::full([256], 3.0, DType::F32, dev))??;
        let ready = s1.record_event()?;
        s2.wait_event(&ready)?;
        let b = dev.with_stream(&s2, || (&a * 2.0)?.realize())?;
        b?;
        s2.synchronize()
    })?;
    assert_eq!(p.streams(), vec![s1.id(), s2.id()]);
    let kinds: Vec<(RecordKind, StreamId)> = p
        .records
        .iter()
        .filter(|r| !matches!(r.kind, RecordKind::Allocate | RecordKind::Compile))
        .map(|r| (r.kind, r.stream))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (RecordKind::Kernel, s1.id()),
            (RecordKind::EventRecord, s1.id()),
            (RecordKind::EventWait, s2.id()),
            (RecordKind::Kernel, s2.id()),
            (RecordKind::Synchronize, s2.id()),
        ],
        "{p}"
    );
    let at = |k: RecordKind| {
        p.records
            .iter()
            .find(|r| r.kind == k)
            .and_then(|r| r.device_start_us)
            .unwrap()
    };
    let fill_end = p.device_work().next().unwrap().device_end_us.unwrap();
    let second_start = p.device_work().nth(1).unwrap().device_start_us.unwrap();
    // The event completes after the fill, and the waiting stream's kernel starts after it.
    assert!(at(RecordKind::EventRecord) + 1.0 >= fill_end, "{p}");
    assert!(second_start + 1.0 >= at(RecordKind::EventRecord), "{p}");
    Ok(())
}
test_device!(two_streams_and_an_event_between_them, streams_and_events);

fn chrome_trace(dev: &Device) -> Result<()> {
    let s1 = dev.new_stream()?;
    let p = dev.profile(|| {
        Tensor::ones([128], DType::F32, dev)?.realize()?;
        std::thread::sleep(std::time::Duration::from_millis(20));
        dev.with_stream(&s1, || Tensor::zeros([128], DType::F32, dev))??;
        dev.synchronize()
    })?;
    let path = std::env::temp_dir().join(format!("strata-trace-{}.json", std::process::id()));
    p.save_chrome_trace(&path)?;
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let json: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    let events = json["traceEvents"]
        .as_array()
        .expect("traceEvents is an array");
    let mut tracks = Vec::new();
    let mut kernels = Vec::new();
    let mut enqueues = Vec::new();
    for e in events {
        let ph = e["ph"].as_str().expect("every event has a phase");
        assert!(
            e["name"].is_string() && e["pid"].is_u64() && e["tid"].is_u64(),
            "{e}"
        );
        match ph {
            "M" => {
                if e["name"] == "thread_name" {
                    tracks.push(e["args"]["name"].as_str().unwrap().to_string());
                }
            }
            "X" => {
                assert!(
                    e["ts"].is_number() && e["dur"].as_f64().unwrap() >= 0.0,
                    "{e}"
                );
                if e["cat"] == "kernel" {
                    kernels.push(e["tid"].as_u64().unwrap());
                }
                if e["cat"] == "host kernel" {
                    enqueues.push(e["ts"].as_f64().unwrap());
                }
            }
            "i" | "s" | "f" => assert!(e["ts"].is_number(), "{e}"),
            other => panic!("unexpected phase {other}"),
        }
    }
    // One track for the host and one per stream.
    let mut want = vec!["host".to_string()];
    want.extend(p.streams().iter().map(|s| format!("stream #{}", s.0)));
    assert_eq!(tracks, want);
    // Two fills on two tracks, enqueued at least the 20 ms sleep apart: times are
    // microseconds. (Their device times may be closer: wgpu submits at the synchronize.)
    assert_eq!(kernels.len(), 2, "{text}");
    assert_ne!(kernels[0], kernels[1]);
    assert!(enqueues[1] - enqueues[0] >= 20_000.0, "{enqueues:?}");
    Ok(())
}
test_device!(
    the_chrome_trace_follows_the_trace_event_format,
    chrome_trace
);

fn one_at_a_time(dev: &Device) -> Result<()> {
    let first = dev.start_profiling()?;
    let err = dev
        .start_profiling()
        .err()
        .expect("a second profile is refused");
    assert!(err.to_string().contains("already recording"), "{err}");
    drop(first);
    // A dropped profiler recorded nothing that leaks into the next profile.
    let p = dev.profile(|| Ok(()))?;
    assert!(p.records.is_empty(), "{p}");
    let failed = dev.profile(|| Tensor::ones([2], DType::F32, dev)?.reshape([3]).map(|_| ()));
    assert!(failed.unwrap_err().to_string().contains("[3]"));
    // The failed closure still stopped its profile.
    dev.profile(|| Ok(()))?;
    Ok(())
}
test_device!(one_profile_at_a_time_and_errors_stop_it, one_at_a_time);

/// A new kernel launched small three times. On CUDA the first launch runs alone and compiles
/// one program; the second compiles the kernel's batched form and runs in a batch (the
/// profiler names it `strata_map_batch`), the third reuses it.
fn batched_form_at_the_second_small_launch(dev: &Device) -> Result<()> {
    let host = [0.5f64, -1.5, 2.25, 3.0, -0.75];
    let a = Tensor::from_slice(&host, [5], dev)?;
    let mut values = Vec::new();
    let p = dev.profile(|| {
        for _ in 0..3 {
            // A chain no other test fuses, so its kernel is new to the shared device.
            let b = ((a.cos()? * &a)?.floor()? - 0.25)?;
            values.push(b.to_vec::<f64>()?);
        }
        Ok(())
    })?;
    let want: Vec<f64> = host.iter().map(|x| (x.cos() * x).floor() - 0.25).collect();
    for v in &values {
        assert_eq!(v, &want, "{p}");
    }
    if dev.kind() != strata::BackendKind::Cuda || !dev.fusion() {
        return Ok(());
    }
    let kernels: Vec<&str> = p
        .records
        .iter()
        .filter(|r| r.kind == RecordKind::Kernel)
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(
        kernels,
        ["strata_map", "strata_map_batch", "strata_map_batch"],
        "{p}"
    );
    // Whether each launch compiled something: a compile record before the kernel's.
    let mut compiled = Vec::new();
    let mut compile_seen = false;
    for r in &p.records {
        match r.kind {
            RecordKind::Compile => compile_seen = true,
            RecordKind::Kernel => compiled.push(std::mem::take(&mut compile_seen)),
            _ => {}
        }
    }
    assert_eq!(compiled, [true, true, false], "{p}");
    Ok(())
}
test_device!(
    a_kernels_batched_form_compiles_at_its_second_small_launch,
    batched_form_at_the_second_small_launch
);

/// The profiler names what ran, for every kernel kind: the kernel (or library call) each
/// backend launched, planned once for the launch, the name and the compile ahead. On CUDA a
/// contiguous f32 matmul is cuBLAS, while a strided one (a layout cuBLAS cannot take), one of
/// k = 0 and an integer one run strata's kernel, which the profiler compiles before the launch
/// it times (a fresh device, so nothing is compiled yet).
fn names_what_ran(dev: &Device) -> Result<()> {
    let dev = &match dev.kind() {
        strata::BackendKind::Cuda => Device::cuda(0)?,
        strata::BackendKind::Wgpu => Device::parse("wgpu")?,
        strata::BackendKind::Cpu => Device::cpu(),
    };
    let mut g = Generator::new(11);
    let x = Tensor::randn([64, 256], DType::F32, &mut g, dev)?;
    let w = Tensor::randn([256, 48], DType::F32, &mut g, dev)?;
    let i = Tensor::arange(0, 64 * 8, 1, DType::I32, dev)?.reshape([64, 8])?;
    let iw = Tensor::arange(0, 8 * 4, 1, DType::I32, dev)?.reshape([8, 4])?;
    let idx = Tensor::from_slice(&[3i64, 0, 63], [3], dev)?;
    dev.synchronize()?;
    let kernels = |f: &mut dyn FnMut() -> Result<()>| -> Result<(Vec<String>, Vec<String>)> {
        let p = dev.profile(&mut *f)?;
        let of = |kind| {
            p.records
                .iter()
                .filter(|r| r.kind == kind)
                .map(|r| r.name.clone())
                .collect::<Vec<_>>()
        };
        Ok((of(RecordKind::Kernel), of(RecordKind::Compile)))
    };
    let by_kind = |cuda: &[&str], wgpu: &[&str], cpu: &[&str]| -> Vec<String> {
        let names = match dev.kind() {
            strata::BackendKind::Cuda => cuda,
            strata::BackendKind::Wgpu => wgpu,
            strata::BackendKind::Cpu => cpu,
        };
        names.iter().map(|s| s.to_string()).collect()
    };
    let (map, _) = kernels(&mut || (&x * 2.0)?.realize())?;
    assert_eq!(map, by_kind(&["strata_map"], &["strata_map"], &["cpu map"]));
    let (sum, _) = kernels(&mut || x.sum(-1, false)?.realize())?;
    assert_eq!(
        sum,
        by_kind(&["strata_reduce"], &["strata_reduce"], &["reduce"])
    );
    let (dense, _) = kernels(&mut || x.matmul(&w)?.realize())?;
    let gemm = "cublasGemmStridedBatchedEx";
    assert_eq!(dense, by_kind(&[gemm], &["strata_matmul"], &["matmul"]));
    // Every other column: inner stride 2, a layout cuBLAS cannot express.
    let strided = x.slice(s![.., ..;2])?;
    let w_top = w.slice(s![..128, ..])?;
    let (ran, compiled) = kernels(&mut || strided.matmul(&w_top)?.realize())?;
    assert_eq!(
        ran,
        by_kind(&["strata_matmul"], &["strata_matmul"], &["matmul"])
    );
    if dev.kind() == strata::BackendKind::Cuda {
        assert_eq!(
            compiled,
            ["compile strata_matmul"],
            "compiled ahead: what ran"
        );
    }
    let (empty_a, empty_b) = (
        Tensor::zeros([4, 0], DType::F32, dev)?,
        Tensor::zeros([0, 3], DType::F32, dev)?,
    );
    let (k0, _) = kernels(&mut || empty_a.matmul(&empty_b)?.realize())?;
    if !k0.is_empty() {
        assert_eq!(
            k0,
            by_kind(&["strata_matmul"], &["strata_matmul"], &["matmul"])
        );
    }
    let (ints, _) = kernels(&mut || i.matmul(&iw)?.realize())?;
    assert_eq!(
        ints,
        by_kind(&["strata_matmul"], &["strata_matmul"], &["matmul"])
    );
    // (After a map that zeroes the gather's range flag.)
    let (gather, _) = kernels(&mut || x.index_select(0, &idx)?.realize())?;
    let last = gather.last().cloned().into_iter().collect::<Vec<_>>();
    assert_eq!(
        last,
        by_kind(&["strata_index"], &["strata_index"], &["gather"])
    );
    let (softmax, _) = kernels(&mut || x.softmax(-1)?.realize())?;
    assert_eq!(
        softmax,
        by_kind(&["strata_softmax"], &["strata_softmax"], &["softmax"])
    );
    Ok(())
}
test_device!(
    the_profiler_names_what_ran_for_every_kernel_kind,
    names_what_ran
);

/// Run in a child process with `STRATA_PROFILE=1` by the test below.
#[test]
fn strata_profile_child() {
    if std::env::var("STRATA_PROFILE_CHILD").is_err() {
        return;
    }
    for dev in strata_tests::devices() {
        let a = Tensor::ones([64], DType::F32, &dev).unwrap();
        let b = (&a * 2.0).unwrap();
        dev.synchronize().unwrap();
        println!(
            "SUM {}",
            b.sum(Axes::All, false).unwrap().item::<f32>().unwrap()
        );
    }
}

#[test]
fn strata_profile_prints_a_table_at_each_synchronization() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "strata_profile_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STRATA_PROFILE", "1")
        .env("STRATA_PROFILE_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let devices = strata_tests::devices().len();
    // Per device: one table at `synchronize` (the fill and the mul), one at `item` (the sum
    // and the download).
    assert_eq!(text.matches("profile of ").count(), 2 * devices, "{text}");
    assert_eq!(text.matches("SUM 128").count(), devices, "{text}");
    assert!(
        text.contains("download") && text.contains("synchronize device"),
        "{text}"
    );
}

/// The CPU backend with events that cannot be timed, like a wgpu adapter without
/// TIMESTAMP_QUERY: a profile then waits for each op and times it from its enqueue to the
/// end of that wait, and says so.
#[derive(Debug)]
struct Untimed(strata::cpu::CpuBackend);

impl strata::Backend for Untimed {
    fn kind(&self) -> strata::BackendKind {
        self.0.kind()
    }
    fn name(&self) -> String {
        "untimed cpu".into()
    }
    fn check_dtype(&self, dtype: DType) -> Result<()> {
        self.0.check_dtype(dtype)
    }
    fn target(&self) -> &strata::target::Target {
        self.0.target()
    }
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
    ) -> Result<std::sync::Arc<dyn strata::DeviceBuffer>> {
        self.0.allocate(bytes, stream)
    }
    fn upload(
        &self,
        dst: &dyn strata::DeviceBuffer,
        at: usize,
        data: &[u8],
        stream: StreamId,
    ) -> Result<()> {
        self.0.upload(dst, at, data, stream)
    }
    fn download(
        &self,
        src: &dyn strata::DeviceBuffer,
        at: usize,
        out: &mut [u8],
        stream: StreamId,
    ) -> Result<()> {
        self.0.download(src, at, out, stream)
    }
    fn run(
        &self,
        kernel: &strata::ir::Kernel,
        args: &strata::backend::KernelArgs,
        stream: StreamId,
    ) -> Result<()> {
        self.0.run(kernel, args, stream)
    }
    fn memory_stats(&self) -> strata::MemoryStats {
        self.0.memory_stats()
    }
    fn empty_cache(&self) {
        self.0.empty_cache()
    }
    fn new_stream(&self) -> Result<StreamId> {
        self.0.new_stream()
    }
    fn destroy_stream(&self, stream: StreamId) {
        self.0.destroy_stream(stream)
    }
    fn record_event(&self, stream: StreamId) -> Result<strata::EventId> {
        self.0.record_event(stream)
    }
    fn wait_event(&self, stream: StreamId, event: strata::EventId) -> Result<()> {
        self.0.wait_event(stream, event)
    }
    fn synchronize_event(&self, event: strata::EventId) -> Result<()> {
        self.0.synchronize_event(event)
    }
    fn elapsed_ms(&self, _: strata::EventId, _: strata::EventId) -> Result<f64> {
        Err(strata::Error::Unsupported(
            "these events cannot be timed".into(),
        ))
    }
    fn destroy_event(&self, event: strata::EventId) {
        self.0.destroy_event(event)
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<()> {
        self.0.synchronize_stream(stream)
    }
    fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
}

#[test]
fn without_timed_events_each_op_is_waited_for_and_timed_by_the_host() {
    let dev = Device::from_backend(std::sync::Arc::new(Untimed(strata::cpu::CpuBackend::new())));
    let a = Tensor::ones([4096], DType::F32, &dev).unwrap();
    let p = dev
        .profile(|| {
            (&a * 2.0)?.exp()?.realize()?;
            (&a + 1.0)?.to_vec::<f32>().map(|_| ())
        })
        .unwrap();
    assert!(p.timing.contains("cannot time events"), "{}", p.timing);
    let work: Vec<_> = p.device_work().collect();
    // mul and exp are one kernel when fused (STRATA_FUSION=0 runs them apart), then add, then the copy.
    let kernels = if dev.fusion() { 2 } else { 3 };
    assert_eq!(work.len(), kernels + 1, "{p}");
    for r in work {
        let (start, end) = (r.device_start_us.unwrap(), r.device_end_us.unwrap());
        // From the enqueue to the end of the wait: the op ran inside that span.
        assert_eq!(start, r.host_start_us, "{p}");
        assert!(end >= r.host_end_us, "{p}");
    }
}

/// Two devices' profiles on one timeline: a host lane and stream lanes for each, labelled with
/// the device, and the second profile's times shifted onto the first's clock (it started 5 ms
/// later, so its kernel, run after the first device's, is drawn after it).
fn several_devices(dev: &Device) -> Result<()> {
    let other = Device::cpu();
    let first = dev.start_profiling()?;
    std::thread::sleep(std::time::Duration::from_millis(5));
    let second = other.start_profiling()?;
    Tensor::ones([64], DType::F32, dev)?.exp()?.realize()?;
    dev.synchronize()?;
    Tensor::ones([64], DType::F32, &other)?.sqrt()?.realize()?;
    let (a, b) = (first.stop()?, second.stop()?);
    let svg = Profile::timeline_svg_of(&[&a, &b]).to_string();
    let short = |d: &Device| d.name().split(" (").next().unwrap().to_string();
    let (na, nb) = if short(dev) == short(&other) {
        (
            format!("{} #0", short(dev)),
            format!("{} #1", short(&other)),
        )
    } else {
        (short(dev), short(&other))
    };
    for label in [
        format!("{na} host"),
        format!("{na} stream #0"),
        format!("{nb} host"),
        format!("{nb} stream #0"),
    ] {
        assert!(
            svg.contains(&format!(">{label}<")),
            "no lane {label:?}: {svg}"
        );
    }
    let kernels = a.device_work().count() + b.device_work().count();
    assert_eq!(svg.matches("class=\"bar kernel\"").count(), kernels);
    // The x of each kernel bar, in order: the first profile's, then the second's.
    let xs: Vec<f64> = svg
        .split("class=\"bar kernel\" x=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().parse().unwrap())
        .collect();
    let (mine, theirs) = xs.split_at(a.device_work().count());
    let last_exp = mine.iter().cloned().fold(f64::MIN, f64::max);
    assert!(
        theirs.iter().all(|&x| x > last_exp),
        "the second device's kernels {theirs:?} drawn before the first's {mine:?}"
    );
    // The same as one Chrome trace: a process per device, its kernels on its own clock
    // shifted onto the first's.
    let json: serde_json::Value =
        serde_json::from_str(&Profile::chrome_trace_of(&[&a, &b])).expect("the trace is JSON");
    let events = json["traceEvents"].as_array().unwrap();
    for (pid, p) in [(1, &a), (2, &b)] {
        let named = events.iter().any(|e| {
            e["name"] == "process_name"
                && e["pid"] == pid
                && e["args"]["name"].as_str().unwrap().contains(&p.device)
        });
        assert!(named, "process {pid} is not named for {}", p.device);
    }
    let starts = |pid: u64| -> Vec<f64> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["cat"] == "kernel")
            .map(|e| e["ts"].as_f64().unwrap())
            .collect()
    };
    let (ka, kb) = (starts(1), starts(2));
    assert_eq!(ka.len() + kb.len(), kernels);
    let last = ka.iter().cloned().fold(f64::MIN, f64::max);
    assert!(kb.iter().all(|&t| t > last), "{kb:?} before {ka:?}");
    Ok(())
}
test_device!(
    several_devices_share_one_timeline_with_a_lane_per_device_and_stream,
    several_devices
);
