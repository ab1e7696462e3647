//! Training on real data (issue 40), on every device: the UCI digits that ship with strata,
//! the seeded split and batch iterator (the same batches on every backend), and a small CNN
//! trained on the digits reaching at least 95% accuracy on held-out images.

use strata::nn::data::{digits, permutation, split, Batches};
use strata::nn::functional::{cross_entropy, Reduction};
use strata::nn::{
    AdamW, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, Module, Optimizer, Relu, Sequential,
};
use strata::prelude::*;
use strata_tests::test_device;

/// The file as its README describes it: 1,797 images of pixels in [0, 1], each digit
/// 174–183 times; the first images are 0, 1, 2, … as in scikit-learn's copy.
fn the_digits(dev: &Device) -> Result<()> {
    let d = digits(dev)?;
    assert_eq!(d.images.shape(), &[1797, 1, 8, 8]);
    let labels = d.labels.to_vec::<i64>()?;
    assert_eq!(labels[..10], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let mut counts = [0usize; 10];
    labels.iter().for_each(|&l| counts[l as usize] += 1);
    assert_eq!(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    let pixels = d.images.to_vec::<f32>()?;
    assert!(pixels
        .iter()
        .all(|&p| (0.0..=1.0).contains(&p) && (p * 16.0).fract() == 0.0));
    // The first image (a 0): row 0 of the file is 0,0,5,13,9,1,0,0.
    assert_eq!(
        pixels[..8],
        [0.0, 0.0, 5.0, 13.0, 9.0, 1.0, 0.0, 0.0].map(|v| v / 16.0)
    );
    Ok(())
}

test_device!(the_digits_file_reads_as_documented, the_digits);

/// A split keeps each row's image and label together and uses every row once; a shuffled
/// epoch visits every row once, in an order that depends on the seed and the epoch only (the
/// same on every device as on the CPU), and an unshuffled one in the file's order.
fn splits_and_batches(dev: &Device) -> Result<()> {
    let n = 50usize;
    let rows = Tensor::arange(0, n as i64, 1, DType::I64, dev)?;
    let doubled = rows.mul(2)?.to_dtype(DType::F32)?.reshape([n, 1])?;
    let (a, b) = split(&[&rows, &doubled], 30, 4)?;
    let mut seen: Vec<i64> = a[0].to_vec::<i64>()?;
    seen.extend(b[0].to_vec::<i64>()?);
    let pairs = a[1].to_vec::<f32>()?;
    for (r, d) in a[0].to_vec::<i64>()?.iter().zip(&pairs) {
        assert_eq!(*d, 2.0 * *r as f32, "split kept rows together");
    }
    seen.sort();
    assert_eq!(seen, (0..n as i64).collect::<Vec<_>>());

    let batches = Batches::new(&[&rows, &doubled], 8)?.shuffle(11);
    assert_eq!(batches.len(), 7);
    let epoch = |e: u64| -> Result<Vec<i64>> {
        let mut order = Vec::new();
        for batch in batches.epoch(e) {
            let batch = batch?;
            let r = batch[0].to_vec::<i64>()?;
            let d = batch[1].to_vec::<f32>()?;
            assert!(r.iter().zip(&d).all(|(r, d)| *d == 2.0 * *r as f32));
            order.extend(r);
        }
        Ok(order)
    };
    let (e0, e1) = (epoch(0)?, epoch(1)?);
    let want = |e| {
        permutation(n, 11, e)
            .into_iter()
            .map(|i| i as i64)
            .collect::<Vec<_>>()
    };
    assert_eq!((e0.clone(), e1.clone()), (want(0), want(1)));
    assert_ne!(e0, e1);
    let ordered: Vec<i64> = Batches::new(&[&rows], 8)?
        .epoch(0)
        .map(|b| b.and_then(|b| b[0].to_vec::<i64>()))
        .collect::<Result<Vec<_>>>()?
        .concat();
    assert_eq!(ordered, (0..n as i64).collect::<Vec<_>>());
    Ok(())
}

test_device!(
    splits_and_batches_cover_every_row_in_a_seeded_order,
    splits_and_batches
);

/// The fraction of `images` whose largest score is their label.
fn accuracy(net: &Sequential, images: &Tensor, labels: &Tensor) -> Result<f64> {
    let predicted = no_grad(|| net.forward(images))?.argmax(Some(-1), false)?;
    let right = predicted
        .eq(labels)?
        .to_dtype(DType::I64)?
        .sum(Axes::All, false)?;
    Ok(right.item::<i64>()? as f64 / labels.shape()[0] as f64)
}

/// `net` followed by a 3×3 convolution from `inputs` to `outputs` channels (padding 1),
/// batch norm, relu and a 2×2 max pool, which halves the image.
fn conv_block(
    net: Sequential,
    inputs: usize,
    outputs: usize,
    g: &mut Generator,
    dev: &Device,
) -> Result<Sequential> {
    Ok(net
        .layer(Conv2d::new(
            inputs,
            outputs,
            [3, 3],
            [1, 1],
            [1, 1],
            DType::F32,
            g,
            dev,
        )?)
        .layer(BatchNorm2d::new(outputs, DType::F32, dev)?)
        .layer(Relu)
        .layer(MaxPool2d::new([2, 2])))
}

/// Two convolution blocks (conv, batch norm, relu, 2×2 max pool) and a linear layer, trained
/// with AdamW on 1,497 of the digits for four epochs: at least 95% of the other 300 right.
fn cnn_on_digits(dev: &Device) -> Result<()> {
    let d = digits(dev)?;
    let (train, test) = split(&[&d.images, &d.labels], 1497, 0)?;
    let mut g = Generator::new(1);
    let net = conv_block(Sequential::new(), 1, 8, &mut g, dev)?;
    let mut net = conv_block(net, 8, 16, &mut g, dev)?
        .layer(Flatten)
        .layer(Linear::new(16 * 2 * 2, 10, true, DType::F32, &mut g, dev)?);
    let mut opt = AdamW::new(net.parameters(), 0.01)?;
    let batches = Batches::new(&[&train[0], &train[1]], 64)?.shuffle(2);
    let epochs = 4;
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        net.train(true);
        for batch in batches.epoch(epoch) {
            let batch = batch?;
            let loss = cross_entropy(&net.forward(&batch[0])?, &batch[1], 0.0, Reduction::Mean)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            losses.push(loss.item::<f32>()?);
        }
    }
    net.train(false);
    let held_out = accuracy(&net, &test[0], &test[1])?;
    let first = losses[..4].iter().sum::<f32>() / 4.0;
    let last = losses[losses.len() - 4..].iter().sum::<f32>() / 4.0;
    assert!(
        held_out >= 0.95,
        "held-out accuracy {held_out:.3} after {epochs} epochs (loss {first:.3} → {last:.3})"
    );
    Ok(())
}

test_device!(a_small_cnn_learns_the_digits_to_95_percent, cnn_on_digits);
