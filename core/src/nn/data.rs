//! Data for training (issue 40): the UCI handwritten digits that ship with strata, a seeded
//! split into training and held-out rows, and [`Batches`], a seeded shuffling batch iterator
//! (PyTorch's `DataLoader` without workers). Orders are drawn on the host from Philox, so a
//! seed gives the same batches on every backend and machine.
//!
//! ```
//! use strata_core::nn::data::{digits, split, Batches};
//! use strata_core::Device;
//! let dev = Device::cpu();
//! let d = digits(&dev)?;
//! let (train, test) = split(&[&d.images, &d.labels], 1500, 0)?;
//! assert_eq!((train[0].shape()[0], test[1].shape()[0]), (1500, 297));
//! let batches = Batches::new(&[&train[0], &train[1]], 64)?.shuffle(7);
//! let first = batches.epoch(0).next().unwrap()?;
//! assert_eq!((first[0].shape(), first[1].shape()), (&[64, 1, 8, 8][..], &[64][..]));
//! # Ok::<(), strata_core::Error>(())
//! ```

use crate::device::Device;
use crate::error::{Error, Result};
use crate::ir::philox4x32_10;
use crate::tensor::Tensor;

/// The digits file (`core/data/digits.csv`; its README gives source and licence), compiled in.
const DIGITS_CSV: &str = include_str!("../../data/digits.csv");

/// The UCI handwritten digits: 1,797 grey 8×8 images of the digits 0–9 (CC BY 4.0; Alpaydin
/// and Kaynak, 1998; see `core/data/README.md`).
#[derive(Debug, Clone)]
pub struct Digits {
    /// `[1797, 1, 8, 8]` f32, each pixel in `[0, 1]` (the file's 0–16 divided by 16).
    pub images: Tensor,
    /// `[1797]` i64, the digit each image shows.
    pub labels: Tensor,
}

/// The UCI handwritten digits on `dev`, in the file's order.
///
/// ```
/// let d = strata_core::nn::data::digits(&strata_core::Device::cpu())?;
/// assert_eq!(d.images.shape(), &[1797, 1, 8, 8]);
/// assert_eq!(d.labels.to_vec::<i64>()?[..3], [0, 1, 2]);
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn digits(dev: &Device) -> Result<Digits> {
    let mut pixels = Vec::with_capacity(1797 * 64);
    let mut labels = Vec::with_capacity(1797);
    for (row, line) in DIGITS_CSV.lines().enumerate() {
        let values: Vec<u8> = line
            .split(',')
            .map(|v| v.trim().parse::<u8>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::Invalid(format!("digits.csv line {}: {e}", row + 1)))?;
        if values.len() != 65 || values[64] > 9 || values[..64].iter().any(|&p| p > 16) {
            return Err(Error::Invalid(format!(
                "digits.csv line {}: expected 64 pixels in 0..=16 and a digit, got {line:?}",
                row + 1
            )));
        }
        pixels.extend(values[..64].iter().map(|&p| f32::from(p) / 16.0));
        labels.push(i64::from(values[64]));
    }
    let n = labels.len();
    Ok(Digits {
        images: Tensor::from_vec(pixels, [n, 1, 8, 8], dev)?,
        labels: Tensor::from_vec(labels, [n], dev)?,
    })
}

/// A permutation of `0..n` drawn from `seed` and `stream` (Fisher–Yates over Philox4x32-10
/// words): the same on every machine.
///
/// ```
/// use strata_core::nn::data::permutation;
/// let p = permutation(10, 1, 0);
/// let mut sorted = p.clone();
/// sorted.sort();
/// assert_eq!(sorted, (0..10).collect::<Vec<_>>());
/// assert_eq!(p, permutation(10, 1, 0));
/// assert_ne!(p, permutation(10, 1, 1));
/// ```
pub fn permutation(n: usize, seed: u64, stream: u64) -> Vec<usize> {
    let key = [seed as u32, (seed >> 32) as u32];
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let c = i as u64;
        let w = philox4x32_10(
            [
                c as u32,
                (c >> 32) as u32,
                stream as u32,
                (stream >> 32) as u32,
            ],
            key,
        );
        let r = (u64::from(w[0]) << 32 | u64::from(w[1])) % (c + 1);
        order.swap(i, r as usize);
    }
    order
}

/// The length of every tensor's first axis, or `Err` when they differ or there are none.
fn common_len(tensors: &[&Tensor], what: &str) -> Result<usize> {
    let lens: Vec<usize> = tensors
        .iter()
        .map(|t| t.shape().first().copied().unwrap_or(0))
        .collect();
    match lens.first() {
        None => Err(Error::Invalid(format!("{what} takes at least one tensor"))),
        Some(&n) if lens.iter().all(|&l| l == n) && tensors.iter().all(|t| t.ndim() > 0) => Ok(n),
        Some(_) => Err(Error::Shape(format!(
            "{what}: the tensors' first axes must have one length, got shapes {:?}",
            tensors
                .iter()
                .map(|t| t.shape().to_vec())
                .collect::<Vec<_>>()
        ))),
    }
}

/// The rows (first-axis entries) of `tensors` shuffled by `seed` and split into the first
/// `first` and the rest, the same rows of every tensor kept together (PyTorch's
/// `random_split` of a `TensorDataset`).
///
/// ```
/// use strata_core::nn::data::split;
/// use strata_core::{Device, Tensor};
/// let x = Tensor::from_slice(&[0i64, 1, 2, 3, 4], [5], &Device::cpu())?;
/// let (a, b) = split(&[&x, &x.mul(10)?], 3, 0)?;
/// let (a0, a1) = (a[0].to_vec::<i64>()?, a[1].to_vec::<i64>()?);
/// assert_eq!(a1, a0.iter().map(|v| v * 10).collect::<Vec<_>>());
/// assert_eq!((a0.len(), b[0].shape()), (3, &[2][..]));
/// assert!(split(&[&x], 6, 0).is_err());
/// # Ok::<(), strata_core::Error>(())
/// ```
pub fn split(tensors: &[&Tensor], first: usize, seed: u64) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let n = common_len(tensors, "split")?;
    if first > n {
        return Err(Error::Shape(format!(
            "split: {first} rows asked for of {n}"
        )));
    }
    let order: Vec<i64> = permutation(n, seed, u64::MAX)
        .into_iter()
        .map(|i| i as i64)
        .collect();
    let dev = tensors[0].device();
    let head = Tensor::from_slice(&order[..first], [first], dev)?;
    let tail = Tensor::from_slice(&order[first..], [n - first], dev)?;
    let pick = |index: &Tensor| -> Result<Vec<Tensor>> {
        tensors.iter().map(|t| t.index_select(0, index)).collect()
    };
    Ok((pick(&head)?, pick(&tail)?))
}

/// Batches of rows of several tensors that share their first axis (inputs and labels), in
/// order or shuffled anew each epoch from a seed. Each batch is a `Vec` with one tensor per
/// input tensor, on the inputs' device.
///
/// ```
/// use strata_core::nn::data::Batches;
/// use strata_core::{Device, Tensor};
/// let x = Tensor::arange(0.0, 5.0, 1.0, strata_core::DType::F32, &Device::cpu())?;
/// let b = Batches::new(&[&x], 2)?;
/// assert_eq!(b.len(), 3); // 2 + 2 + 1
/// let sizes: Vec<usize> = b.epoch(0).map(|t| t.map(|t| t[0].shape()[0])).collect::<Result<_, _>>()?;
/// assert_eq!(sizes, [2, 2, 1]);
/// assert_eq!(b.drop_last(true).len(), 2);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Batches {
    tensors: Vec<Tensor>,
    rows: usize,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
}

impl Batches {
    /// Batches of `batch_size` rows of `tensors`, in order, the last one shorter when the
    /// rows do not divide evenly. `Err` when the first axes differ or `batch_size` is 0.
    ///
    /// ```
    /// use strata_core::nn::data::Batches;
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let (x, y) = (Tensor::zeros([4, 3], DType::F32, &dev)?, Tensor::zeros([5], DType::I64, &dev)?);
    /// assert!(Batches::new(&[&x, &y], 2).is_err());
    /// assert!(Batches::new(&[&x], 0).is_err());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn new(tensors: &[&Tensor], batch_size: usize) -> Result<Batches> {
        let rows = common_len(tensors, "Batches")?;
        if batch_size == 0 {
            return Err(Error::Invalid("Batches: a batch size of 0".into()));
        }
        Ok(Batches {
            tensors: tensors.iter().map(|&t| t.clone()).collect(),
            rows,
            batch_size,
            seed: None,
            drop_last: false,
        })
    }

    /// Shuffled: each epoch visits the rows in its own order, drawn from `seed` and the epoch.
    ///
    /// ```
    /// use strata_core::nn::data::Batches;
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::arange(0.0, 8.0, 1.0, DType::F32, &Device::cpu())?;
    /// let b = Batches::new(&[&x], 8)?.shuffle(3);
    /// let epoch = |e| -> strata_core::Result<Vec<f32>> { b.epoch(e).next().unwrap()?[0].to_vec::<f32>() };
    /// assert_eq!(epoch(0)?, epoch(0)?);
    /// assert_ne!(epoch(0)?, epoch(1)?);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn shuffle(mut self, seed: u64) -> Batches {
        self.seed = Some(seed);
        self
    }

    /// Leave out the last batch when it is shorter than the others (`drop_last=True`).
    ///
    /// ```
    /// use strata_core::nn::data::Batches;
    /// let x = strata_core::Tensor::zeros([5], strata_core::DType::F32, &strata_core::Device::cpu())?;
    /// assert_eq!(Batches::new(&[&x], 2)?.drop_last(true).epoch(0).count(), 2);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn drop_last(mut self, drop: bool) -> Batches {
        self.drop_last = drop;
        self
    }

    /// The number of batches in an epoch.
    ///
    /// ```
    /// use strata_core::nn::data::Batches;
    /// let x = strata_core::Tensor::zeros([10], strata_core::DType::F32, &strata_core::Device::cpu())?;
    /// assert_eq!(Batches::new(&[&x], 4)?.len(), 3);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        if self.drop_last {
            self.rows / self.batch_size
        } else {
            self.rows.div_ceil(self.batch_size)
        }
    }

    /// Whether an epoch has no batch (no rows, or fewer than a batch with `drop_last`).
    ///
    /// ```
    /// use strata_core::nn::data::Batches;
    /// let x = strata_core::Tensor::zeros([3], strata_core::DType::F32, &strata_core::Device::cpu())?;
    /// assert!(Batches::new(&[&x], 4)?.drop_last(true).is_empty());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batches of epoch `epoch`, in its order. A shuffled epoch uploads its order once
    /// (an i64 index) and gathers each batch's rows with `index_select`; an ordered one
    /// yields views of the tensors.
    ///
    /// ```
    /// use strata_core::nn::data::Batches;
    /// use strata_core::{Device, DType, Tensor};
    /// let x = Tensor::arange(0.0, 4.0, 1.0, DType::F32, &Device::cpu())?;
    /// let firsts: Vec<f32> = Batches::new(&[&x], 2)?
    ///     .epoch(0)
    ///     .map(|b| b.and_then(|b| b[0].to_vec::<f32>()).map(|v| v[0]))
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(firsts, [0.0, 2.0]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn epoch(&self, epoch: u64) -> Epoch<'_> {
        let order = self.seed.map(|seed| {
            let order: Vec<i64> = permutation(self.rows, seed, epoch)
                .into_iter()
                .map(|i| i as i64)
                .collect();
            Tensor::from_vec(order, [self.rows], self.tensors[0].device())
        });
        Epoch {
            batches: self,
            order,
            next: 0,
        }
    }
}

/// The batches of one epoch of a [`Batches`], each a `Result` (a gather can fail on a
/// device).
///
/// ```
/// use strata_core::nn::data::Batches;
/// let x = strata_core::Tensor::zeros([6, 2], strata_core::DType::F32, &strata_core::Device::cpu())?;
/// for batch in Batches::new(&[&x], 4)?.shuffle(0).epoch(2) {
///     assert_eq!(batch?[0].shape()[1], 2);
/// }
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Epoch<'a> {
    batches: &'a Batches,
    order: Option<Result<Tensor>>,
    next: usize,
}

impl Iterator for Epoch<'_> {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Result<Vec<Tensor>>> {
        let b = self.batches;
        if self.next >= b.len() {
            return None;
        }
        let start = self.next * b.batch_size;
        let len = b.batch_size.min(b.rows - start);
        self.next += 1;
        Some(match &self.order {
            None => b.tensors.iter().map(|t| t.narrow(0, start, len)).collect(),
            Some(Err(e)) => Err(e.clone()),
            Some(Ok(order)) => order.narrow(0, start, len).and_then(|index| {
                b.tensors
                    .iter()
                    .map(|t| t.index_select(0, &index))
                    .collect()
            }),
        })
    }
}
