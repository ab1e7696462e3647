//! A tour of strata's tensors on the best device present: `cargo run --release --example tour`.
//! Set `STRATA_DEVICE=cpu|cuda:N|wgpu` to choose the device.

use strata::prelude::*;

fn main() -> Result<()> {
    // Looking for wgpu adapters runs Mesa's Vulkan device-select layer, which asks Wayland for
    // a display; without XDG_RUNTIME_DIR libwayland prints an error line per try. Outside a
    // desktop session (ssh, a container) give it a private folder, before any thread starts.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join("strata-xdg-runtime");
        if std::fs::create_dir_all(&dir).is_ok() {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
    let dev = Device::auto()?;
    println!("device: {dev}\n");

    let t = Tensor::arange(0, 24, 1, DType::I32, &dev)?.reshape([2, 3, 4])?;
    println!("t = arange(24).reshape([2, 3, 4]):\n{t}\n");

    let v = t.slice(s![-1, 1.., ..;-2])?;
    println!(
        "t[-1, 1:, ::-2] is a view (shape {:?}, strides {:?}, offset {}):\n{v}\n",
        v.shape(),
        v.strides(),
        v.offset()
    );

    v.fill(-1)?;
    println!("after v.fill(-1), t sees the write:\n{t}\n");

    let p = t.permute([2, 0, 1])?;
    println!(
        "t.permute([2, 0, 1]): shape {:?}, strides {:?}, contiguous {}",
        p.shape(),
        p.strides(),
        p.is_contiguous()
    );
    println!(
        "reshape of that copies: shares storage = {}\n",
        p.reshape([-1])?.shares_storage(&t)
    );

    let u = Tensor::from_slice(&[-1.5f32, 0.5, 300.0, f32::NAN], [4], &dev)?;
    println!(
        "casts follow one rule on every backend:\n  f32 {}\n  as u8 (saturating from float, NaN -> 0): {}",
        u.format_values()?,
        u.to_dtype(DType::U8)?.format_values()?
    );
    let w = Tensor::from_slice(&[300i32, -1], [2], &dev)?;
    println!(
        "  i32 [300, -1] as u8 wraps: {}, saturating: {}\n",
        w.to_dtype(DType::U8)?.format_values()?,
        w.to_dtype_sat(DType::U8)?.format_values()?
    );

    println!(
        "linspace(0, 1, 5) as f16:\n{}\n",
        Tensor::linspace(0.0, 1.0, 5, DType::F16, &dev)?
    );
    println!(
        "a large tensor is summarized:\n{}\n",
        Tensor::arange(0.0, 1.0, 1e-4, DType::F64, &dev)?.reshape([100, 100])?
    );

    let s = dev.new_stream()?;
    let start = s.record_event()?;
    let big = dev.with_stream(&s, || Tensor::ones([1 << 22], DType::F32, &dev))??;
    let end = s.record_event()?;
    end.synchronize()?;
    println!(
        "filled {} floats on a side stream in {:.3} ms",
        big.numel(),
        start.elapsed_ms(&end)?
    );
    println!("memory: {}", dev.memory_stats());
    Ok(())
}
