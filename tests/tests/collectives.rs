//! Collectives (issue 41). Everywhere: core's checks and bookkeeping through a host engine
//! over two CPU devices (what each collective sends where, and the shapes of its results).
//! Where there are two CUDA devices: NCCL's every collective × dtype × op against values
//! computed on the host, on tensors written by kernels just before, over the devices of one
//! process and with one process per GPU (the launcher pattern).

use std::sync::Arc;
use strata::collective::{
    nccl, nccl_from_env, nccl_id, nccl_rank, Collective, CollectiveEngine, Communicator, RankCall,
    ReduceOp,
};
use strata::nn::{DataParallel, Optimizer, Sgd};
use strata::prelude::*;

/// The collectives on f32 host memory, by address: what NCCL computes, for two CPU devices.
#[derive(Debug)]
struct HostEngine;

fn combine(op: ReduceOp, values: &[f32]) -> f32 {
    match op {
        ReduceOp::Sum => values.iter().sum(),
        ReduceOp::Prod => values.iter().product(),
        ReduceOp::Max => values.iter().cloned().fold(f32::MIN, f32::max),
        ReduceOp::Min => values.iter().cloned().fold(f32::MAX, f32::min),
        ReduceOp::Avg => values.iter().sum::<f32>() / values.len() as f32,
    }
}

impl CollectiveEngine for HostEngine {
    fn check_dtype(&self, dtype: DType) -> Result<()> {
        match dtype {
            DType::F32 => Ok(()),
            other => Err(Error::Unsupported(format!(
                "the host engine moves f32, not {other}"
            ))),
        }
    }

    fn run(&self, collective: Collective, calls: &[RankCall], _: DType) -> Result<()> {
        let world = calls.len();
        // SAFETY: core passed addresses of live CPU buffers holding `count` f32 each (the
        // send side; the receive side as the collective sizes it), and nothing else runs.
        let read =
            |at: u64, n: usize| unsafe { std::slice::from_raw_parts(at as *const f32, n).to_vec() };
        let write = |at: u64, v: &[f32]| unsafe {
            std::slice::from_raw_parts_mut(at as *mut f32, v.len()).copy_from_slice(v)
        };
        let n = calls[0].count;
        let sent: Vec<Vec<f32>> = calls.iter().map(|c| read(c.send, n)).collect();
        let reduced = |op| -> Vec<f32> {
            (0..n)
                .map(|i| combine(op, &sent.iter().map(|s| s[i]).collect::<Vec<_>>()))
                .collect()
        };
        match collective {
            Collective::AllReduce(op) => calls.iter().for_each(|c| write(c.recv, &reduced(op))),
            Collective::Broadcast { root } => calls.iter().for_each(|c| write(c.recv, &sent[root])),
            Collective::Reduce { root, op } => write(calls[root].recv, &reduced(op)),
            Collective::AllGather => {
                let all: Vec<f32> = sent.concat();
                calls.iter().for_each(|c| write(c.recv, &all));
            }
            Collective::ReduceScatter(op) => {
                let whole: Vec<f32> = (0..n * world)
                    .map(|i| {
                        combine(
                            op,
                            &calls
                                .iter()
                                .map(|c| read(c.send, n * world)[i])
                                .collect::<Vec<_>>(),
                        )
                    })
                    .collect();
                for (k, c) in calls.iter().enumerate() {
                    write(c.recv, &whole[k * n..(k + 1) * n]);
                }
            }
        }
        Ok(())
    }
}

/// Rank `k`'s values: 1 + k, 2 + k, … as `dtype` on `dev`, written by a kernel.
fn rank_values(k: usize, shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    Tensor::arange(0, n as i64, 1, DType::F64, dev)?
        .remainder(7)?
        .add(1.0 + k as f64)?
        .to_dtype(dtype)?
        .reshape(shape.to_vec())
}

/// Every collective of `comm` on f32 or `dtype` values, against the host.
fn every_collective(comm: &Communicator, dtype: DType) -> Result<()> {
    let devices = comm.devices();
    let world = devices.len();
    let host = |k: usize, n: usize| -> Vec<f64> {
        (0..n).map(|i| (i % 7) as f64 + 1.0 + k as f64).collect()
    };
    let ops: &[ReduceOp] = if dtype.is_float() {
        &[
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ]
    } else {
        &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min]
    };
    // Integer products wrap at the dtype's width, as NCCL's (4 devices overflow an i8).
    let wrap = |v: f64| -> f64 {
        let i = v as i128;
        match dtype {
            DType::I8 => i as i8 as f64,
            DType::U8 => i as u8 as f64,
            DType::I32 => i as i32 as f64,
            DType::U32 => i as u32 as f64,
            _ => v,
        }
    };
    let fold = |op: ReduceOp, vs: Vec<f64>| -> f64 {
        match op {
            ReduceOp::Sum => vs.iter().sum(),
            ReduceOp::Prod => wrap(vs.iter().product()),
            ReduceOp::Max => vs.iter().cloned().fold(f64::MIN, f64::max),
            ReduceOp::Min => vs.iter().cloned().fold(f64::MAX, f64::min),
            ReduceOp::Avg => vs.iter().sum::<f64>() / vs.len() as f64,
        }
    };
    let shape = [2 * world, 5];
    let n = 10 * world;
    let values = |t: &Tensor| -> Result<Vec<f64>> { t.to_dtype(DType::F64)?.to_vec::<f64>() };
    let close = |got: &[f64], want: &[f64], what: &str| {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-2 * w.abs().max(1.0),
                "{what} {dtype} at {i}: {g} vs {w}"
            );
        }
    };
    let fresh = || -> Result<Vec<Tensor>> {
        devices
            .iter()
            .enumerate()
            .map(|(k, d)| rank_values(k, &shape, dtype, d))
            .collect()
    };
    for &op in ops {
        let want: Vec<f64> = (0..n)
            .map(|i| fold(op, (0..world).map(|k| host(k, n)[i]).collect()))
            .collect();
        let ts = fresh()?;
        comm.all_reduce(&ts, op)?;
        for t in &ts {
            close(&values(t)?, &want, &format!("all_reduce {op}"));
        }
        let ts = fresh()?;
        comm.reduce(&ts, world - 1, op)?;
        close(&values(&ts[world - 1])?, &want, &format!("reduce {op}"));
        close(
            &values(&ts[0])?,
            &host(0, n),
            &format!("reduce {op} (not the root)"),
        );
        let outs = comm.reduce_scatter(&fresh()?, op)?;
        for (k, t) in outs.iter().enumerate() {
            assert_eq!(t.shape(), &[2, 5]);
            close(
                &values(t)?,
                &want[k * 10..(k + 1) * 10],
                &format!("reduce_scatter {op}"),
            );
        }
    }
    let ts = fresh()?;
    comm.broadcast(&ts, 1 % world)?;
    for t in &ts {
        close(&values(t)?, &host(1 % world, n), "broadcast");
    }
    let outs = comm.all_gather(&fresh()?)?;
    let all: Vec<f64> = (0..world).flat_map(|k| host(k, n)).collect();
    for t in &outs {
        assert_eq!(t.shape(), &[world, 2 * world, 5]);
        close(&values(t)?, &all, "all_gather");
    }
    Ok(())
}

#[test]
fn core_checks_and_runs_each_collective_through_an_engine() {
    let devices = vec![Device::cpu(), Device::cpu()];
    let comm = Communicator::new(devices.clone(), Arc::new(HostEngine)).unwrap();
    every_collective(&comm, DType::F32).unwrap();
    let ones = |d: &Device, shape: &[usize]| Tensor::ones(shape.to_vec(), DType::F32, d).unwrap();
    let (a, b) = (ones(&devices[0], &[4]), ones(&devices[1], &[4]));
    // One tensor per device, in the communicator's order, one shape, contiguous, a dtype the
    // engine moves, a root that exists, a first axis that splits evenly.
    assert!(comm
        .all_reduce(std::slice::from_ref(&a), ReduceOp::Sum)
        .is_err());
    assert!(matches!(
        comm.all_reduce(&[b.clone(), a.clone()], ReduceOp::Sum),
        Err(Error::DeviceMismatch(_))
    ));
    assert!(comm
        .all_reduce(&[a.clone(), ones(&devices[1], &[5])], ReduceOp::Sum)
        .is_err());
    let strided = ones(&devices[1], &[8]).slice(s![..;2]).unwrap();
    assert!(comm
        .all_reduce(&[a.clone(), strided], ReduceOp::Sum)
        .unwrap_err()
        .to_string()
        .contains("contiguous"));
    let ints = |d: &Device| Tensor::ones([4], DType::I32, d).unwrap();
    assert!(matches!(
        comm.all_reduce(&[ints(&devices[0]), ints(&devices[1])], ReduceOp::Sum),
        Err(Error::Unsupported(_))
    ));
    assert!(comm.broadcast(&[a.clone(), b.clone()], 2).is_err());
    assert!(comm
        .reduce_scatter(
            &[ones(&devices[0], &[3]), ones(&devices[1], &[3])],
            ReduceOp::Sum
        )
        .is_err());
    assert!(Communicator::new(
        vec![devices[0].clone(), devices[0].clone()],
        Arc::new(HostEngine)
    )
    .is_err());
    // Nothing was written by a refused call.
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0; 4]);
}

#[test]
fn nccl_needs_cuda_devices() {
    let err = nccl(&[Device::cpu()]).unwrap_err();
    assert!(err.to_string().contains("CUDA"), "{err}");
}

/// NCCL over two (or all) CUDA devices: every collective × dtype × op.
#[test]
fn nccl_collectives_match_the_host() {
    let gpus = Device::cuda_count();
    if gpus < 2 {
        eprintln!("{gpus} CUDA device(s): the NCCL collectives need two, not tested here");
        return;
    }
    let devices: Vec<Device> = (0..gpus).map(|i| Device::cuda(i).unwrap()).collect();
    let comm = nccl(&devices).unwrap();
    assert!(matches!(
        nccl(&[devices[0].clone(), Device::cuda(0).unwrap()]),
        Err(Error::Invalid(_))
    ));
    for dtype in [
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ] {
        every_collective(&comm, dtype).unwrap_or_else(|e| panic!("{dtype}: {e}"));
    }
    let bools: Vec<Tensor> = devices
        .iter()
        .map(|d| Tensor::ones([2], DType::Bool, d).unwrap())
        .collect();
    assert!(matches!(
        comm.all_reduce(&bools, ReduceOp::Sum),
        Err(Error::Unsupported(_))
    ));
    // On a stream of each device that is not its default, right after a kernel there.
    let sides: Vec<Stream> = devices.iter().map(|d| d.new_stream().unwrap()).collect();
    for (d, s) in devices.iter().zip(&sides) {
        d.set_stream(s).unwrap();
    }
    let big: Vec<Tensor> = devices
        .iter()
        .map(|d| {
            Tensor::ones([1 << 24], DType::F32, d)
                .unwrap()
                .mul(2.0)
                .unwrap()
        })
        .collect();
    comm.all_reduce(&big, ReduceOp::Sum).unwrap();
    for d in &devices {
        d.set_stream(&d.default_stream()).unwrap();
    }
    for t in &big {
        assert_eq!(
            t.min(Axes::All, false).unwrap().item::<f32>().unwrap(),
            2.0 * gpus as f32
        );
    }
}

/// One process per GPU, as a launcher (torchrun) starts them: this test starts itself once
/// per GPU with `RANK`, `WORLD_SIZE` and `STRATA_NCCL_ID` set; each process joins with
/// `nccl_from_env` and runs an all-reduce, an all-gather, a reduce-scatter and a broadcast
/// on its own GPU, checks the values and says so.
#[test]
fn nccl_one_process_per_gpu() {
    if std::env::var("STRATA_TEST_RANK").is_ok() {
        return one_rank();
    }
    assert!(nccl_rank(&Device::cpu(), 0, 1, "00").is_err());
    let gpus = Device::cuda_count();
    if gpus < 2 {
        eprintln!("{gpus} CUDA device(s): one process per GPU needs two, not tested here");
        return;
    }
    let id = nccl_id().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..gpus)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args([
                    "nccl_one_process_per_gpu",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("STRATA_TEST_RANK", "1")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", gpus.to_string())
                .env("STRATA_NCCL_ID", &id)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains(&format!("rank {rank} of {gpus}: ok")),
            "rank {rank}: {text}"
        );
    }
}

/// A child of `nccl_one_process_per_gpu`: its rank's part.
fn one_rank() {
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let world: usize = std::env::var("WORLD_SIZE").unwrap().parse().unwrap();
    let dev = Device::cuda(rank).unwrap();
    let comm = nccl_from_env(&dev).unwrap();
    assert_eq!((comm.ranks(), comm.world()), (&[rank][..], world));
    let mine = Tensor::full([4, 3], (rank + 1) as f64, DType::F32, &dev)
        .unwrap()
        .mul(1.0)
        .unwrap();
    let summed = mine.clone();
    comm.all_reduce(std::slice::from_ref(&summed), ReduceOp::Sum)
        .unwrap();
    let total = (world * (world + 1) / 2) as f32;
    assert_eq!(summed.to_vec::<f32>().unwrap(), vec![total; 12]);
    let gathered = comm
        .all_gather(&[Tensor::full([2], rank as f64, DType::I64, &dev).unwrap()])
        .unwrap();
    let want: Vec<i64> = (0..world as i64).flat_map(|k| [k, k]).collect();
    assert_eq!(gathered[0].to_vec::<i64>().unwrap(), want);
    let block = comm
        .reduce_scatter(
            &[Tensor::ones([2 * world], DType::F64, &dev).unwrap()],
            ReduceOp::Sum,
        )
        .unwrap();
    assert_eq!(block[0].to_vec::<f64>().unwrap(), vec![world as f64; 2]);
    let sent = Tensor::full([3], (rank * 10) as f64, DType::BF16, &dev).unwrap();
    comm.broadcast(std::slice::from_ref(&sent), world - 1)
        .unwrap();
    assert_eq!(
        sent.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![((world - 1) * 10) as f32; 3]
    );
    println!("rank {rank} of {world}: ok");
}

/// A small MLP: relu(x·w1 + b1)·w2.
fn mlp(params: &[Tensor], x: &Tensor) -> Result<Tensor> {
    x.matmul(&params[0])?
        .add(&params[1])?
        .relu()?
        .matmul(&params[2])
}

fn mse(pred: &Tensor, y: &Tensor) -> Result<Tensor> {
    pred.sub(y)?.square()?.mean(Axes::All, false)
}

/// How a data-parallel step computes each replica's gradients.
#[derive(Clone, Copy, Debug)]
enum Passes {
    /// One backward pass a replica, from this thread.
    One,
    /// `autograd::grad` and `set_grad`: no hook runs, `average_gradients` averages it all.
    Functional,
    /// Two passes a replica over the halves of its shard (half the loss each), the first
    /// under `no_sync` or not.
    Accumulated { no_sync: bool },
    /// One pass a replica, each on a thread of its own.
    Threads,
}

/// Five SGD steps of the MLP (`hidden` units, `outputs` outputs) data-parallel over
/// `comm`'s devices (each device a shard of the batch, gradients averaged), each step
/// computing the gradients another way ([`Passes`]), against the same steps on one device
/// with the whole batch: the parameters agree, and the replicas are identical. Where hooks
/// run, the backward passes average the buckets themselves (the gradients already agree
/// when they end).
fn data_parallel_equals_one_device(
    comm: Communicator,
    hidden: usize,
    outputs: usize,
) -> Result<()> {
    let devices = comm.devices().to_vec();
    let n = devices.len();
    let home = devices[0].clone();
    let mut g = Generator::new(7);
    let params = vec![
        Tensor::randn([8, hidden], DType::F32, &mut g, &home)?.mul(0.3)?,
        Tensor::randn([hidden], DType::F32, &mut g, &home)?.mul(0.1)?,
        Tensor::randn([hidden, outputs], DType::F32, &mut g, &home)?
            .mul(0.3 / (hidden as f64 / 16.0).sqrt())?,
    ];
    let x = Tensor::randn([16 * n, 8], DType::F32, &mut g, &home)?;
    let y = Tensor::randn([16 * n, outputs], DType::F32, &mut g, &home)?;
    let single: Vec<Tensor> = params
        .iter()
        .map(|p| p.detach().contiguous()?.requires_grad_(true))
        .collect::<Result<_>>()?;
    let mut one = Sgd::new(single.clone(), 0.05)?;
    let dp = DataParallel::new(comm, &params)?;
    let mut each: Vec<Sgd> = (0..n)
        .map(|k| Sgd::new(dp.replica(k).to_vec(), 0.05))
        .collect::<Result<_>>()?;
    let steps = [
        Passes::One,
        Passes::Functional,
        Passes::Accumulated { no_sync: true },
        Passes::Accumulated { no_sync: false },
        Passes::Threads,
    ];
    for passes in steps {
        mse(&mlp(&single, &x)?, &y)?.backward()?;
        one.step()?;
        one.zero_grad();
        let (xs, ys) = (dp.scatter(&x)?, dp.scatter(&y)?);
        let pass = |k: usize| mse(&mlp(dp.replica(k), &xs[k])?, &ys[k])?.backward();
        match passes {
            Passes::One => (0..n).try_for_each(pass)?,
            Passes::Threads => std::thread::scope(|s| {
                let passes: Vec<_> = (0..n).map(|k| s.spawn(move || pass(k))).collect();
                passes
                    .into_iter()
                    .try_for_each(|p| p.join().expect("a backward thread panicked"))
            })?,
            Passes::Functional => {
                for k in 0..n {
                    let loss = mse(&mlp(dp.replica(k), &xs[k])?, &ys[k])?;
                    let inputs: Vec<&Tensor> = dp.replica(k).iter().collect();
                    let grads = strata::autograd::grad(&[&loss], &inputs, None, false)?;
                    for (p, g) in dp.replica(k).iter().zip(grads) {
                        p.set_grad(g)?;
                    }
                }
            }
            Passes::Accumulated { no_sync } => {
                let half = |k: usize, h: usize| -> Result<()> {
                    let (xh, yh) = (xs[k].narrow(0, 8 * h, 8)?, ys[k].narrow(0, 8 * h, 8)?);
                    mse(&mlp(dp.replica(k), &xh)?, &yh)?.mul(0.5)?.backward()
                };
                if no_sync {
                    dp.no_sync(|| (0..n).try_for_each(|k| half(k, 0)))?;
                } else {
                    (0..n).try_for_each(|k| half(k, 0))?;
                }
                (0..n).try_for_each(|k| half(k, 1))?;
            }
        }
        if !matches!(passes, Passes::Functional) {
            for i in 0..params.len() {
                let first = dp.replica(0)[i].grad().unwrap().to_vec::<f32>()?;
                for k in 1..n {
                    let other = dp.replica(k)[i].grad().unwrap().to_vec::<f32>()?;
                    assert_eq!(
                        other, first,
                        "{passes:?}: gradient {i} of replica {k} before average_gradients"
                    );
                }
            }
        }
        dp.average_gradients()?;
        for opt in &mut each {
            opt.step()?;
            opt.zero_grad();
        }
    }
    for (i, p) in single.iter().enumerate() {
        let want = p.to_vec::<f32>()?;
        let first = dp.replica(0)[i].to_vec::<f32>()?;
        for (a, b) in first.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "parameter {i}: {a} vs {b}"
            );
        }
        for k in 1..n {
            assert_eq!(
                dp.replica(k)[i].to_vec::<f32>()?,
                first,
                "replica {k} of parameter {i}"
            );
        }
    }
    if n > 1 {
        let uneven = Tensor::ones([2 * n + 1, 3], DType::F32, &home)?;
        assert!(dp.scatter(&uneven).is_err());
    }
    Ok(())
}

#[test]
fn data_parallel_steps_equal_one_device_through_an_engine() {
    let comm =
        || Communicator::new(vec![Device::cpu(), Device::cpu()], Arc::new(HostEngine)).unwrap();
    data_parallel_equals_one_device(comm(), 16, 1).unwrap();
    // Two buckets (the last parameter, 1.25 MiB, fills the first).
    data_parallel_equals_one_device(comm(), 4096, 80).unwrap();
}

/// One GPU is a communicator of one: the buckets still go through NCCL on the averaging
/// stream, ordered after the backward kernels and before the optimizer's on the main one.
#[test]
fn nccl_data_parallel_on_one_gpu_equals_plain_steps() {
    if Device::cuda_count() == 0 {
        eprintln!("no CUDA device: not tested here");
        return;
    }
    let gpu = Device::cuda(0).unwrap();
    data_parallel_equals_one_device(nccl(&[gpu]).unwrap(), 4096, 80).unwrap();
}

#[test]
fn nccl_data_parallel_steps_equal_one_gpu() {
    let gpus = Device::cuda_count();
    if gpus < 2 {
        eprintln!("{gpus} CUDA device(s): data-parallel training needs two, not tested here");
        return;
    }
    let devices: Vec<Device> = (0..gpus).map(|i| Device::cuda(i).unwrap()).collect();
    data_parallel_equals_one_device(nccl(&devices).unwrap(), 16, 1).unwrap();
    data_parallel_equals_one_device(nccl(&devices).unwrap(), 4096, 80).unwrap();
}
