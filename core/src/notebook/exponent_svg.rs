//! An exponent histogram as a bar chart (neon's `hist_bins` shown to a learner): one bar per
//! power of two that occurs, on a log scale of counts, with the normal ranges of f16 and bf16
//! shaded behind the bars and f16's subnormals and overflow marked, so values that will not
//! survive a cast to half precision stand out. Zeros, subnormals, infinities and NaNs are
//! listed under the title.

use super::html::escape;
use super::svg::Svg;
use crate::exponent_histogram::ExponentHistogram;
use std::fmt::Write;

const H: f64 = 220.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 34.0;
/// Horizontal pixels per power of two.
const STEP: f64 = 9.0;

impl ExponentHistogram {
    /// The histogram as a bar chart titled `title`: a bar per exponent from the smallest to
    /// the largest that occurs (at least f16's range, −24 to 16), heights on a log scale,
    /// f16's normal range (2^-14 to 2^15) shaded blue, its subnormals (2^-24 to 2^-15) light
    /// blue and what overflows it (2^16 and up) red; bf16's range is f32's, so only values
    /// past 2^127 overflow it.
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let t = Tensor::from_slice(&[1e-6f32, 0.5, 7e4], [3], &Device::cpu()).unwrap();
    /// let svg = t.exponent_histogram().unwrap().svg("activations").to_string();
    /// assert!(svg.starts_with("<svg") && svg.contains("activations") && svg.contains("f16"));
    /// ```
    pub fn svg(&self, title: &str) -> Svg {
        let (lo, hi) = match self.range() {
            Some((a, b)) => (a.min(-24), b.max(16)),
            None => (-24, 16),
        };
        let bars = (hi - lo + 1) as f64;
        let w = LEFT + RIGHT + bars * STEP;
        let (x0, y0, y1) = (LEFT, H - BOTTOM, TOP);
        let x_of = |e: i32| x0 + (e - lo) as f64 * STEP;
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{H}\" \
             font-family=\"monospace\" font-size=\"11\"><rect width=\"{w}\" height=\"{H}\" \
             fill=\"#ffffff\" rx=\"6\"/><text x=\"{LEFT}\" y=\"16\" fill=\"#24292f\" \
             font-size=\"12\">{} ({}, {} values)</text>",
            escape(title),
            self.dtype,
            self.total()
        );
        let _ = write!(
            s,
            "<text x=\"{LEFT}\" y=\"32\" fill=\"#57606a\">zeros {}  subnormal {}  inf {}  \
             NaN {}</text>",
            self.zeros, self.subnormals, self.infinities, self.nans
        );
        // The ranges behind the bars: f16 subnormals, f16 normals, past f16.
        let band = |s: &mut String, from: i32, to: i32, fill: &str, label: &str| {
            let (a, b) = (from.max(lo), to.min(hi));
            if a > b {
                return;
            }
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{y1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#57606a\" font-size=\"9\">{label}</text>",
                x_of(a),
                (b - a + 1) as f64 * STEP,
                y0 - y1,
                x_of(a) + 2.0,
                y1 + 10.0
            );
        };
        band(&mut s, -24, -15, "#eef4ff", "f16 sub");
        band(&mut s, -14, 15, "#dbe9ff", "f16 normal");
        band(&mut s, 16, 127, "#ffe3e3", "overflows f16");
        band(&mut s, 128, hi, "#ffc9c9", "overflows bf16");
        let top = self.counts.iter().copied().max().unwrap_or(0).max(1) as f64;
        let height = |c: u64| (c as f64 + 1.0).log10() / (top + 1.0).log10() * (y0 - y1);
        for e in lo..=hi {
            let c = self.count(e);
            if c == 0 {
                continue;
            }
            let h = height(c);
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" \
                 fill=\"#0969da\"><title>2^{e}: {c}</title></rect>",
                x_of(e) + 1.0,
                y0 - h,
                STEP - 2.0
            );
        }
        let _ = write!(
            s,
            "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{:.1}\" y2=\"{y0}\" stroke=\"#57606a\"/>",
            w - RIGHT
        );
        // Exponent labels every eight powers, and at 0.
        for e in lo..=hi {
            if e % 8 == 0 {
                let _ = write!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#57606a\" text-anchor=\"middle\">{e}</text>",
                    x_of(e) + STEP / 2.0,
                    y0 + 14.0
                );
            }
        }
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#57606a\" text-anchor=\"end\">log2 |x| \
             (bar height: log count)</text></svg>",
            w - RIGHT,
            H - 4.0
        );
        Svg(s)
    }

    /// Shows the bar chart in an evcxr notebook (titled by the dtype).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// Tensor::ones([3], DType::F32, &Device::cpu())?.exponent_histogram()?.evcxr_display();
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        self.svg("exponent histogram").evcxr_display();
    }
}

impl crate::profile::Profile {
    /// The exponent histograms a [`Device::profile_exponents`](crate::Device::profile_exponents)
    /// counted as one picture: a bar chart per kernel output, titled by the kernel's ops, one
    /// under the other in issue order.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::full([8], 1e3, DType::F32, &dev)?;
    /// let p = dev.profile_exponents(|| (&a * &a)?.realize())?;
    /// assert!(p.exponent_histograms_svg().to_string().contains("mul"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn exponent_histograms_svg(&self) -> Svg {
        let mut body = String::new();
        let (mut y, mut width) = (0.0f64, 0.0f64);
        for (record, h) in &self.exponent_histograms {
            let ops = self
                .records
                .get(*record)
                .map(|r| r.ops.join(" → "))
                .unwrap_or_default();
            let chart = h.svg(&format!("kernel {record}: {ops}")).0;
            let w = chart
                .split("width=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            width = width.max(w);
            // A nested <svg> placed at its offset keeps each chart's own coordinates.
            let _ = write!(
                body,
                "{}",
                chart.replacen("<svg ", &format!("<svg y=\"{y}\" "), 1)
            );
            y += H + 8.0;
        }
        if body.is_empty() {
            return Svg(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"320\" height=\"30\" \
                 font-family=\"monospace\" font-size=\"11\"><text x=\"8\" y=\"20\">no \
                 exponent histograms (profile with profile_exponents)</text></svg>"
                    .to_string(),
            );
        }
        Svg(format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{y}\">{body}</svg>"
        ))
    }
}
