//! Views against plain index arithmetic: random shapes (rank ≤ 5), random index expressions
//! (negative indices and steps, new axes, ellipsis), chained views, and writes through views.

use proptest::prelude::*;
use strata::prelude::*;
use strata::SliceArg;
use strata_tests::indices;

/// A plain n-d array of base positions: the reference a view is checked against.
#[derive(Debug, Clone)]
struct Positions {
    shape: Vec<usize>,
    data: Vec<usize>,
}

/// CPython's slice adjustment, written out directly (independent of strata's `resolve_range`).
fn python_slice(start: Option<isize>, stop: Option<isize>, step: isize, n: usize) -> Vec<usize> {
    let n = n as isize;
    let (lower, upper) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let adjust = |v: Option<isize>, default: isize| match v {
        None => default,
        Some(v) if v < 0 => (v + n).max(lower),
        Some(v) => v.min(upper),
    };
    let start = adjust(start, if step > 0 { lower } else { upper });
    let stop = adjust(stop, if step > 0 { upper } else { lower });
    let mut out = vec![];
    let mut i = start;
    while (step > 0 && i < stop) || (step < 0 && i > stop) {
        out.push(i as usize);
        i += step;
    }
    out
}

/// Applies basic indexing to a reference array by gathering elements explicitly.
fn reference(base: &Positions, args: &[SliceArg]) -> Positions {
    let consuming = args
        .iter()
        .filter(|a| matches!(a, SliceArg::Index(_) | SliceArg::Range { .. }))
        .count();
    // Per result axis: which base axis it walks (None for a new axis) and the positions.
    let mut axes: Vec<(Option<usize>, Vec<usize>)> = vec![];
    let mut fixed: Vec<Option<usize>> = vec![None; base.shape.len()];
    let mut k = 0;
    for arg in args {
        match *arg {
            SliceArg::NewAxis => axes.push((None, vec![0])),
            SliceArg::Ellipsis => {
                for _ in 0..base.shape.len() - consuming {
                    axes.push((Some(k), (0..base.shape[k]).collect()));
                    k += 1;
                }
            }
            SliceArg::Index(i) => {
                let n = base.shape[k] as isize;
                fixed[k] = Some(if i < 0 { i + n } else { i } as usize);
                k += 1;
            }
            SliceArg::Range {
                start, end, step, ..
            } => {
                axes.push((Some(k), python_slice(start, end, step, base.shape[k])));
                k += 1;
            }
            SliceArg::Tensor(_) => unreachable!("the strategy makes basic indices only"),
        }
    }
    while k < base.shape.len() {
        axes.push((Some(k), (0..base.shape[k]).collect()));
        k += 1;
    }
    let shape: Vec<usize> = axes.iter().map(|(_, l)| l.len()).collect();
    let data = indices(&shape)
        .into_iter()
        .map(|idx| {
            let mut b: Vec<usize> = fixed.iter().map(|f| f.unwrap_or(0)).collect();
            for (&(axis, ref list), &i) in axes.iter().zip(&idx) {
                if let Some(a) = axis {
                    b[a] = list[i];
                }
            }
            let flat = b
                .iter()
                .zip(&base.shape)
                .fold(0, |acc, (&i, &n)| acc * n + i);
            base.data[flat]
        })
        .collect();
    Positions { shape, data }
}

fn arg_for_axis(n: usize) -> BoxedStrategy<SliceArg> {
    let n = n as isize;
    let bound = proptest::option::of(-n - 2..=n + 2);
    let step = prop_oneof![-4isize..=-1, 1isize..=4];
    let range = (bound.clone(), bound, step).prop_map(|(start, end, step)| SliceArg::Range {
        start,
        end,
        inclusive: false,
        step,
    });
    if n == 0 {
        range.boxed()
    } else {
        prop_oneof![1 => (-n..n).prop_map(SliceArg::Index), 3 => range].boxed()
    }
}

/// A random index expression for `shape`: per-axis items, maybe truncated, with new axes
/// inserted and maybe a run of full axes replaced by an ellipsis.
fn index_expr(shape: Vec<usize>) -> BoxedStrategy<Vec<SliceArg>> {
    let per_axis: Vec<_> = shape.iter().map(|&n| arg_for_axis(n)).collect();
    let rank = shape.len();
    (
        per_axis,
        0..=rank,
        0..=rank,
        proptest::collection::vec(0..=rank, 0..2),
        any::<bool>(),
    )
        .prop_map(move |(mut args, keep, ell_at, new_axes, use_ellipsis)| {
            if use_ellipsis {
                // Axes from ell_at on (after truncation) become "..." followed by the rest.
                let tail: Vec<SliceArg> = args.split_off(ell_at.min(keep));
                args.push(SliceArg::Ellipsis);
                args.extend(tail.into_iter().skip(keep.saturating_sub(ell_at)));
            } else {
                args.truncate(keep);
            }
            for &p in new_axes.iter().rev() {
                let p = p.min(args.len());
                args.insert(p, SliceArg::NewAxis);
            }
            args
        })
        .boxed()
}

fn shape_and_exprs() -> impl Strategy<Value = (Vec<usize>, Vec<SliceArg>, Vec<SliceArg>)> {
    proptest::collection::vec(0usize..=5, 0..=5).prop_flat_map(|shape| {
        let first = index_expr(shape.clone());
        (Just(shape), first).prop_flat_map(|(shape, first)| {
            let base = Positions {
                data: (0..shape.iter().product()).collect(),
                shape: shape.clone(),
            };
            let second = index_expr(reference(&base, &first).shape);
            (Just(shape), Just(first), second)
        })
    })
}

fn base_tensor(shape: &[usize], dev: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<i32> = (0..n as i32).collect();
    Tensor::from_slice(&data, shape, dev).unwrap()
}

fn as_positions(t: &Tensor) -> Vec<usize> {
    t.to_vec::<i32>()
        .unwrap()
        .into_iter()
        .map(|v| v as usize)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn views_match_index_arithmetic((shape, first, second) in shape_and_exprs()) {
        let dev = Device::cpu();
        let base = base_tensor(&shape, &dev);
        let plain = Positions { shape: shape.clone(), data: (0..shape.iter().product()).collect() };

        let view = base.slice(first.clone()).unwrap();
        let expected = reference(&plain, &first);
        prop_assert_eq!(view.shape(), &expected.shape[..]);
        prop_assert!(view.shares_storage(&base));
        prop_assert_eq!(as_positions(&view), expected.data.clone());

        let chained = view.slice(second.clone()).unwrap();
        let expected2 = reference(&expected, &second);
        prop_assert_eq!(chained.shape(), &expected2.shape[..]);
        prop_assert_eq!(as_positions(&chained), expected2.data.clone());

        // Writing through the chained view changes exactly its elements of the base.
        chained.fill(-1).unwrap();
        let after = base.to_vec::<i32>().unwrap();
        for (p, &v) in after.iter().enumerate() {
            let hit = expected2.data.contains(&p);
            prop_assert_eq!(v, if hit { -1 } else { p as i32 }, "position {}", p);
        }
    }

    #[test]
    fn reshape_of_views_keeps_row_major_order((shape, first, _) in shape_and_exprs()) {
        let dev = Device::cpu();
        let base = base_tensor(&shape, &dev);
        let view = base.slice(first).unwrap();
        let flat = view.reshape([-1]).unwrap();
        prop_assert_eq!(flat.to_vec::<i32>().unwrap(), view.to_vec::<i32>().unwrap());
        if let Ok(v) = view.view([view.numel()]) {
            prop_assert!(v.shares_storage(&base));
            prop_assert_eq!(v.to_vec::<i32>().unwrap(), view.to_vec::<i32>().unwrap());
        }
    }
}

#[test]
fn python_slice_reference_agrees_with_known_cases() {
    assert_eq!(python_slice(None, None, -1, 4), vec![3, 2, 1, 0]);
    assert_eq!(python_slice(Some(3), Some(0), -1, 5), vec![3, 2, 1]);
    assert_eq!(python_slice(Some(-2), None, 1, 5), vec![3, 4]);
    assert_eq!(python_slice(Some(0), Some(4), -1, 5), Vec::<usize>::new());
    assert_eq!(python_slice(Some(10), Some(-10), -3, 5), vec![4, 1]);
}

/// The augpy examples: `t` of shape (2, 2, 4) u8, with NumPy's shapes, strides and offsets.
#[test]
fn augpy_views() {
    let dev = Device::cpu();
    let t = Tensor::zeros([2, 2, 4], DType::U8, &dev).unwrap();
    let cases: Vec<(Tensor, Vec<usize>, Vec<isize>, usize)> = vec![
        (t.slice(s![1, 1, 3]).unwrap(), vec![], vec![], 15),
        (t.slice(s![-1]).unwrap(), vec![2, 4], vec![4, 1], 8),
        (t.slice(s![.., 0]).unwrap(), vec![2, 4], vec![8, 1], 0),
        (
            t.slice(s![.., 1.., 1..-1]).unwrap(),
            vec![2, 1, 2],
            vec![8, 4, 1],
            5,
        ),
        (
            t.slice(s![.., .., ..;2]).unwrap(),
            vec![2, 2, 2],
            vec![8, 4, 2],
            0,
        ),
    ];
    for (view, shape, strides, offset) in cases {
        assert_eq!(view.shape(), &shape[..], "{view:?}");
        assert_eq!(view.strides(), &strides[..], "{view:?}");
        assert_eq!(view.offset(), offset, "{view:?}");
        assert!(view.shares_storage(&t));
    }
}

#[test]
fn negative_steps_and_inclusive_ranges() {
    let dev = Device::cpu();
    let t = Tensor::arange(0, 10, 1, DType::I64, &dev).unwrap();
    let get = |args: Vec<Result<SliceArg>>| t.slice(args).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(get(s![..;-1]), (0..10).rev().collect::<Vec<_>>());
    assert_eq!(get(s![..;-3]), vec![9, 6, 3, 0]);
    assert_eq!(get(s![7..2;-2]), vec![7, 5, 3]);
    assert_eq!(get(s![-3..]), vec![7, 8, 9]);
    assert_eq!(get(s![2..=4]), vec![2, 3, 4]);
    assert_eq!(get(s![..=-2]), (0..9).collect::<Vec<_>>());
    assert_eq!(get(s![4..=0;-2]), vec![4, 2, 0]);
    assert_eq!(get(s![-1..=-3;-1]), vec![9, 8, 7]);
    // Extreme bounds and steps clip instead of overflowing.
    assert_eq!(get(s![..=isize::MAX]), (0..10).collect::<Vec<_>>());
    assert_eq!(get(s![isize::MIN..;isize::MAX]), vec![0]);
    assert_eq!(get(s![..;isize::MIN]), vec![9]);
    let r = t.slice(s![..;-1]).unwrap();
    assert_eq!((r.strides(), r.offset()), (&[-1isize][..], 9));
}

#[test]
fn shape_ops_are_views_with_numpy_strides() {
    let dev = Device::cpu();
    let t = Tensor::arange(0, 24, 1, DType::I32, &dev)
        .unwrap()
        .reshape([2, 3, 4])
        .unwrap();
    let p = t.permute([1, 2, 0]).unwrap();
    assert_eq!((p.shape(), p.strides()), (&[3, 4, 2][..], &[4, 1, 12][..]));
    assert_eq!(
        p.slice(s![1, 2]).unwrap().to_vec::<i32>().unwrap(),
        vec![6, 18]
    );
    let u = t.unsqueeze(1).unwrap();
    assert_eq!(u.shape(), &[2, 1, 3, 4]);
    assert_eq!(u.squeeze().shape(), &[2, 3, 4]);
    let n = t.narrow(-1, 1, 2).unwrap();
    assert_eq!((n.shape(), n.offset()), (&[2, 3, 2][..], 1));
    assert_eq!(
        n.flatten().unwrap().to_vec::<i32>().unwrap()[..4],
        [1, 2, 5, 6]
    );
    let e = Tensor::arange(0, 3, 1, DType::I32, &dev)
        .unwrap()
        .expand([2, 3])
        .unwrap();
    assert_eq!(e.to_vec::<i32>().unwrap(), vec![0, 1, 2, 0, 1, 2]);
    let c = t.transpose(0, 2).unwrap().contiguous().unwrap();
    assert!(c.is_contiguous());
    assert_eq!(c.slice(s![3, 2, 1]).unwrap().item::<i32>().unwrap(), 23);
}
