//! The SVG pictures parse as XML and draw what they show: one timeline bar per kernel and
//! copy, a lane per stream; one layout cell per view element.

use strata::prelude::*;
use strata_tests::test_device;

fn classes<'a>(doc: &'a roxmltree::Document, class: &str) -> Vec<roxmltree::Node<'a, 'a>> {
    doc.descendants()
        .filter(|n| n.attribute("class") == Some(class))
        .collect()
}

fn timeline(dev: &Device) -> Result<()> {
    let s1 = dev.new_stream()?;
    let p = dev.profile(|| {
        let a = Tensor::from_slice(&[1.0f32; 300], [300], dev)?;
        let b = dev.with_stream(&s1, || (&a + 1.0)?.exp())??;
        let c = dev.with_stream(&s1, || b.sum(Axes::All, false))??;
        let e = s1.record_event()?;
        dev.default_stream().wait_event(&e)?;
        c.item::<f32>()?;
        Ok(())
    })?;
    let svg = p.timeline_svg().to_string();
    let doc = roxmltree::Document::parse(&svg).expect("the timeline is XML");
    let count = |kind| p.device_work().filter(|r| r.kind == kind).count();
    assert_eq!(classes(&doc, "bar upload").len(), 1);
    assert_eq!(classes(&doc, "bar download").len(), 1);
    assert_eq!(
        classes(&doc, "bar kernel").len(),
        count(strata::RecordKind::Kernel)
    );
    assert_eq!(classes(&doc, "host enqueue").len(), p.device_work().count());
    assert_eq!(classes(&doc, "marker event").len(), 1);
    assert_eq!(classes(&doc, "marker wait").len(), 1);
    // A lane label per stream, each bar with its tooltip.
    let labels: Vec<&str> = doc
        .descendants()
        .filter(|n| n.is_element())
        .filter_map(|n| n.text())
        .filter(|t| t.starts_with("stream #"))
        .collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    for bar in classes(&doc, "bar kernel") {
        let title = bar.first_element_child().and_then(|t| t.text()).unwrap();
        assert!(title.starts_with("kernel "), "{title}");
    }
    let html = p.to_html();
    assert!(html.contains("<svg") && html.matches("<tr>").count() == p.records.len() + 1);
    Ok(())
}
test_device!(the_timeline_draws_a_bar_per_kernel_and_copy, timeline);

fn layout(dev: &Device) -> Result<()> {
    let t = Tensor::arange(0, 24, 1, DType::I32, dev)?.reshape([4, 6])?;
    // (view, highlighted cells, cells shared by several elements)
    let views = [
        (t.slice(s![1..3, ..;2])?, 6, 0),
        (t.slice(s![.., ..;-1])?, 24, 0),
        (t.t()?, 24, 0),
        (
            Tensor::arange(0, 3, 1, DType::I32, dev)?.broadcast_to([4, 3])?,
            0,
            3,
        ),
    ];
    for (v, plain, shared) in views {
        let svg = v.layout_svg().to_string();
        let doc = roxmltree::Document::parse(&svg).expect("the layout picture is XML");
        let drawn = (
            classes(&doc, "cell view").len(),
            classes(&doc, "cell view shared").len(),
        );
        assert_eq!(drawn, (plain, shared), "{:?} {:?}", v.shape(), v.strides());
    }
    Ok(())
}
test_device!(the_layout_picture_draws_a_cell_per_element, layout);
