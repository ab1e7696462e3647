//! Streams and events under randomized interleavings: in-place updates and reads bounce
//! between two streams, sometimes with an explicit event between them and sometimes without
//! (core then orders the read after the tensor's last write). Every result must equal the
//! sequential one.

use strata::prelude::*;
use strata_tests::test_device;

/// A small deterministic generator (the test must not depend on a crate's RNG).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn interleavings(dev: &Device) -> Result<()> {
    let streams = [dev.new_stream()?, dev.new_stream()?];
    let mut rng = Lcg(7);
    for trial in 0..12 {
        let n = 1 << (10 + trial % 6);
        let x = Tensor::zeros([n], DType::I64, dev)?;
        let y = Tensor::zeros([n], DType::I64, dev)?;
        let (mut want_x, mut want_y) = (0i64, 0i64);
        for _ in 0..24 {
            let s = &streams[rng.next(2) as usize];
            let k = rng.next(100) as i64 + 1;
            match rng.next(4) {
                // x += k on a random stream.
                0 => {
                    dev.with_stream(s, || x.add_(k))??;
                    want_x += k;
                }
                // y = y * 2 + x, reading x written on either stream.
                1 => {
                    dev.with_stream(s, || -> Result<()> {
                        let t = (&y * 2i64)?;
                        y.assign(&(&t + &x)?)
                    })??;
                    want_y = want_y * 2 + want_x;
                }
                // An explicit event from one stream to the other.
                2 => {
                    let e = s.record_event()?;
                    streams[0].wait_event(&e)?;
                    streams[1].wait_event(&e)?;
                }
                // A host read in the middle, on whichever stream is current.
                _ => {
                    let got =
                        dev.with_stream(s, || x.slice(s![n - 1]).and_then(|v| v.item::<i64>()))??;
                    assert_eq!(got, want_x, "trial {trial}: x read mid-sequence");
                }
            }
        }
        assert_eq!(x.to_vec::<i64>()?, vec![want_x; n], "trial {trial}: x");
        assert_eq!(y.to_vec::<i64>()?, vec![want_y; n], "trial {trial}: y");
    }
    dev.synchronize()
}
test_device!(randomized_two_stream_interleavings, interleavings);

fn written_on_a_read_on_b(dev: &Device) -> Result<()> {
    let (a, b) = (dev.new_stream()?, dev.new_stream()?);
    let n = 1 << 20;
    let t = Tensor::zeros([n], DType::F32, dev)?;
    for round in 1..=5 {
        // A slow write on A (several passes), then an immediate read on B, no event.
        dev.with_stream(&a, || -> Result<()> {
            for _ in 0..4 {
                t.add_(0.25)?;
            }
            Ok(())
        })??;
        let sum = dev.with_stream(&b, || t.sum(strata::ops::Axes::All, false))??;
        assert_eq!(sum.item::<f32>()?, (round * n) as f32, "round {round}");
    }
    Ok(())
}
test_device!(
    a_tensor_written_on_a_is_read_on_b_after_the_write,
    written_on_a_read_on_b
);

/// Tiny ops, which the CUDA backend runs in batches (one block, op after op): chains that read
/// what the op before wrote, in-place updates alternating between two kernels, outputs dropped
/// and their memory reused while earlier ops wait, strided views, and a write on one stream read
/// on another without an event, and a read on one stream before a write on another, all give
/// the sequential result.
fn tiny_op_order(dev: &Device) -> Result<()> {
    let mut x = Tensor::zeros([3], DType::I32, dev)?;
    for _ in 0..300 {
        x = (&x + 1i64)?;
    }
    assert_eq!(x.to_vec::<i32>()?, vec![300; 3], "a chain of 300 adds");

    let y = Tensor::zeros([5], DType::I64, dev)?;
    for _ in 0..150 {
        y.add_(3i64)?;
        y.sub_(1i64)?;
    }
    assert_eq!(
        y.to_vec::<i64>()?,
        vec![300; 5],
        "alternating add_ and sub_"
    );

    let a = Tensor::from_slice(&[1.5f32, -2.5], [2], dev)?;
    let mut last = None;
    for k in 0..250 {
        let t = (&a * k as f64)?;
        if k % 50 == 49 {
            last = Some(t);
        }
    }
    let last = last.map(|t| t.to_vec::<f32>()).transpose()?;
    assert_eq!(
        last,
        Some(vec![1.5 * 249.0, -2.5 * 249.0]),
        "dropped outputs"
    );

    let m = Tensor::arange(0, 12, 1, DType::I16, dev)?.reshape([3, 4])?;
    let (mt, d) = (m.t()?, m.t()?.copy()?);
    for _ in 0..100 {
        mt.add_(&d)?;
        mt.sub_(&d.t()?.t()?)?;
    }
    let want: Vec<i16> = (0..12).collect();
    assert_eq!(m.to_vec::<i16>()?, want, "in-place updates through views");

    let s = dev.new_stream()?;
    let z = Tensor::zeros([7], DType::F32, dev)?;
    dev.with_stream(&s, || -> Result<()> {
        for _ in 0..200 {
            z.add_(0.5f32)?;
        }
        Ok(())
    })??;
    let sum = z.sum(strata::ops::Axes::All, false)?.item::<f32>()?;
    assert_eq!(sum, 700.0, "written on one stream, read on another");

    // Read on one stream, then overwritten on another: the read must see the old values even
    // when the second stream's work is made to run first (a host read of x sends it).
    let t = dev.new_stream()?;
    let w = Tensor::ones([16], DType::F32, dev)?;
    let read = dev.with_stream(&s, || &w * 1.0)??;
    dev.with_stream(&t, || w.fill(5.0))??;
    assert_eq!(w.to_vec::<f32>()?, vec![5.0; 16], "the write");
    assert_eq!(read.to_vec::<f32>()?, vec![1.0; 16], "the read before it");
    Ok(())
}
test_device!(tiny_ops_keep_stream_order, tiny_op_order);

fn timing(dev: &Device) -> Result<()> {
    let s = dev.new_stream()?;
    let start = s.record_event()?;
    let t = dev.with_stream(&s, || Tensor::ones([1 << 16], DType::F32, dev))??;
    let _u = dev.with_stream(&s, || (&t * 3.0).and_then(|u| u.exp()))??;
    let end = s.record_event()?;
    s.synchronize()?;
    end.synchronize()?;
    let ms = start.elapsed_ms(&end)?;
    assert!((0.0..10_000.0).contains(&ms), "{ms} ms");
    Ok(())
}
test_device!(events_time_the_work_between_them, timing);
