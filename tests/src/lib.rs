//! Shared pieces of strata's cross-backend tests: the devices to test on and
//! [`test_device!`], which runs one test body on every backend present (after candle's idea).

use strata::prelude::*;

/// The devices present: always the CPU; GPU backends join as they land. `STRATA_TEST_DEVICES`
/// (comma-separated device names) restricts the list.
///
/// ```
/// assert!(!strata_tests::devices().is_empty());
/// ```
pub fn devices() -> Vec<Device> {
    let wanted = std::env::var("STRATA_TEST_DEVICES").ok();
    let names: Vec<String> = match wanted {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => vec!["cpu".into(), "cuda:0".into(), "wgpu".into()],
    };
    names
        .iter()
        .filter_map(|name| Device::parse(name).ok())
        .collect()
}

/// Defines `#[test] fn $name()` that runs `$body(&Device)` on every device of [`devices`],
/// naming the device when it fails.
///
/// ```
/// fn body(dev: &strata::Device) -> strata::Result<()> {
///     assert_eq!(strata::Tensor::ones([1], strata::DType::F32, dev)?.item::<f32>()?, 1.0);
///     Ok(())
/// }
/// strata_tests::test_device!(ones_is_one, body);
/// ```
#[macro_export]
macro_rules! test_device {
    ($name:ident, $body:path) => {
        #[test]
        fn $name() {
            for dev in $crate::devices() {
                if let Err(e) = $body(&dev) {
                    panic!("{} on {}: {e}", stringify!($name), dev.name());
                }
            }
        }
    };
}

/// Row-major multi-indices of `shape`, in order.
///
/// ```
/// assert_eq!(strata_tests::indices(&[2, 2]), vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]);
/// ```
pub fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                (0..n).map(move |i| {
                    let mut p = prefix.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    out
}
