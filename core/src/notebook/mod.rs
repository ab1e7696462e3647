//! Rich display for notebooks (its own module tree, apart from the semantics; PNG and base64
//! from their crates): tensors as an HTML table under a layout header, 2-D tensors as
//! heatmaps, and devices, streams, events and memory statistics as small tables.
//!
//! The `to_html`/`heatmap_png` methods are always there; the `evcxr` feature adds the inherent
//! `evcxr_display` methods that the evcxr Jupyter kernel calls to show a cell's value. Each
//! writes every MIME type in one print, because evcxr keeps one output per type per cell.

mod exponent_svg;
mod graph_svg;
mod heatmap;
mod html;
mod image;
mod layout_svg;
mod plot_svg;
mod profile_html;
mod svg;
mod timeline_svg;

use crate::backend::MemoryStats;
use crate::device::{Device, Event, Stream};
use crate::error::Result;
use crate::tensor::Tensor;
pub(crate) use html::escape;
pub use layout_svg::show_layout_pictures;
pub use plot_svg::line_plot;
pub use svg::Svg;

/// Makes a panic print one line — `panicked at this cell: <message>` for a panic in a
/// notebook cell's own code, `panicked at <file>:<line>: <message>` elsewhere, with a note
/// about the cell's variables — instead of the default message and backtrace. The strata
/// kernel's prelude calls it (evcxr turns backtraces on whatever `RUST_BACKTRACE` says, and
/// its frames are evcxr's runtime, not the user's code).
///
/// ```
/// strata_core::install_notebook_panic_hook();
/// let caught = std::panic::catch_unwind(|| panic!("boom"));
/// assert!(caught.is_err());
/// let _ = std::panic::take_hook(); // back to the default hook
/// ```
pub fn install_notebook_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(a panic without a message)".into());
        // evcxr compiles each cell into `src/lib.rs` of a crate of its own.
        let place = match info.location() {
            Some(l) if l.file() == "src/lib.rs" => "this cell".to_string(),
            Some(l) => format!("{}:{}", l.file(), l.line()),
            None => "an unknown place".to_string(),
        };
        eprintln!(
            "panicked at {place}: {message} (the variables this cell defined are gone; \
             those of earlier cells are kept)"
        );
    }));
}

impl Tensor {
    /// The notebook view of this tensor as HTML: a header with shape, strides, offset, dtype,
    /// device and contiguity, the values as a table (summarized with `…` past 1000 elements),
    /// and for 2-D floats a heatmap with its colour scale. Waits only for the work this tensor
    /// needs and never changes it.
    ///
    /// ```
    /// use strata_core::{s, Device, DType, Tensor};
    /// let t = Tensor::arange(0, 6, 1, DType::I32, &Device::cpu())?.reshape([2, 3])?;
    /// let html = t.slice(s![.., ..;2])?.to_html()?;
    /// assert!(html.contains("shape=[2, 2] strides=[3, 2] offset=0 dtype=i32"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn to_html(&self) -> Result<String> {
        let map = self
            .wants_heatmap()
            .then(|| heatmap::render(self))
            .transpose()?;
        html::tensor(self, map.as_ref())
    }

    /// A PNG heatmap of a non-empty 2-D numeric tensor: one coloured block per element
    /// (sampled with a step past 256 rows or columns), a viridis-like scale from the smallest
    /// finite value to the largest, NaN in grey, and a colour bar at the right.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::eye(3, DType::F32, &Device::cpu())?;
    /// let png = t.heatmap_png()?;
    /// assert_eq!(&png[1..4], b"PNG");
    /// assert!(Tensor::zeros([4], DType::F32, &Device::cpu())?.heatmap_png().is_err());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn heatmap_png(&self) -> Result<Vec<u8>> {
        Ok(heatmap::render(self)?.png)
    }

    /// Whether the notebook display draws a heatmap: 2-D floats with more than one element.
    fn wants_heatmap(&self) -> bool {
        self.ndim() == 2 && self.dtype().is_float() && self.numel() > 1
    }

    /// Shows the tensor in an evcxr notebook: `text/plain` (the `Display` text), `text/html`
    /// (see [`to_html`](Tensor::to_html)) and, for 2-D floats, `image/png`. A value that cannot
    /// be read (a failed kernel, say) shows the error instead.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// Tensor::ones([2, 2], DType::F32, &Device::cpu())?.evcxr_display();
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        let map = if self.wants_heatmap() {
            heatmap::render(self).ok()
        } else {
            None
        };
        let html = html::tensor(self, map.as_ref()).unwrap_or_else(|e| {
            format!(
                "<div style=\"font-family:monospace\"><b>Tensor</b> {}<br>\
                 <span style=\"color:#c00\">values unavailable: {}</span></div>",
                escape(&html::header(self)),
                escape(&e.to_string())
            )
        });
        let png = map.map(|m| image::base64(&m.png));
        emit(&self.to_string(), &html, png.as_deref());
    }
}

/// Prints one display bundle in evcxr's protocol.
#[cfg(feature = "evcxr")]
pub(crate) fn emit(plain: &str, html: &str, png_base64: Option<&str>) {
    let mut out = format!(
        "EVCXR_BEGIN_CONTENT text/plain\n{plain}\nEVCXR_END_CONTENT\n\
         EVCXR_BEGIN_CONTENT text/html\n{html}\nEVCXR_END_CONTENT\n"
    );
    if let Some(png) = png_base64 {
        out.push_str(&format!(
            "EVCXR_BEGIN_CONTENT image/png\n{png}\nEVCXR_END_CONTENT\n"
        ));
    }
    print!("{out}");
}

/// A two-column table of names and values.
fn key_value_table(title: &str, rows: &[(&str, String)]) -> String {
    let mut out = format!(
        "<table style=\"border-collapse:collapse;font-family:monospace;font-size:12px\">\
         <tr><th colspan=\"2\" style=\"text-align:left\">{}</th></tr>",
        escape(title)
    );
    for (key, value) in rows {
        out.push_str(&format!(
            "<tr><td style=\"color:#666;padding:1px 8px 1px 0\">{}</td>\
             <td style=\"text-align:left\">{}</td></tr>",
            escape(key),
            escape(value)
        ));
    }
    out.push_str("</table>");
    out
}

/// `bytes` for people: `1.50 MiB (1572864 bytes)`.
fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.2} {} ({bytes} bytes)", UNITS[unit])
    }
}

impl MemoryStats {
    fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("allocated", human_bytes(self.allocated)),
            ("reserved", human_bytes(self.reserved)),
            ("peak", human_bytes(self.peak)),
        ]
    }

    /// The statistics as an HTML table.
    ///
    /// ```
    /// let html = strata_core::Device::cpu().memory_stats().to_html();
    /// assert!(html.contains("allocated"));
    /// ```
    pub fn to_html(&self) -> String {
        key_value_table("memory", &self.rows())
    }

    /// Shows the statistics in an evcxr notebook.
    ///
    /// ```
    /// strata_core::Device::cpu().memory_stats().evcxr_display();
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        emit(&self.to_string(), &self.to_html(), None);
    }
}

/// One line with units, for terminals (`jupyter console` shows the plain text).
///
/// ```
/// let s = strata_core::MemoryStats { allocated: 1536, reserved: 2048, peak: 1536 };
/// assert_eq!(s.to_string(), "allocated 1.50 KiB (1536 bytes), reserved 2.00 KiB (2048 bytes), peak 1.50 KiB (1536 bytes)");
/// ```
impl std::fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows: Vec<String> = self
            .rows()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        write!(f, "{}", rows.join(", "))
    }
}

impl Device {
    /// The device as an HTML table: name, backend, what the backend tells of its hardware
    /// (on CUDA: index, memory, peer links), current stream, blocking mode, TF32 and memory
    /// statistics.
    ///
    /// ```
    /// let html = strata_core::Device::cpu().to_html();
    /// assert!(html.contains(">backend<") && html.contains(">cpu<") && html.contains("current stream"));
    /// ```
    pub fn to_html(&self) -> String {
        let mut rows = vec![("backend", self.kind().to_string())];
        rows.extend(self.backend().properties());
        rows.extend([
            (
                "current stream",
                format!("#{}", self.current_stream().id().0),
            ),
            ("blocking", self.blocking().to_string()),
            ("lazy fusion", self.fusion().to_string()),
            ("allow TF32", self.allow_tf32().to_string()),
        ]);
        rows.extend(self.memory_stats().rows());
        key_value_table(&format!("Device {}", self.name()), &rows)
    }

    /// Shows the device in an evcxr notebook.
    ///
    /// ```
    /// strata_core::Device::cpu().evcxr_display();
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        emit(&format!("{self:?}"), &self.to_html(), None);
    }
}

impl Stream {
    /// The stream as HTML: its id, its device, and whether ops run on it now.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// assert!(dev.new_stream().unwrap().to_html().contains("current: false"));
    /// ```
    pub fn to_html(&self) -> String {
        let current = self.device().current_stream() == *self;
        format!(
            "<span style=\"font-family:monospace\"><b>Stream</b> #{} on {} (current: {current})\
             </span>",
            self.id().0,
            escape(&self.device().name())
        )
    }

    /// Shows the stream in an evcxr notebook.
    ///
    /// ```
    /// strata_core::Device::cpu().default_stream().evcxr_display();
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        emit(&format!("{self:?}"), &self.to_html(), None);
    }
}

impl Event {
    /// The event as HTML: its id and device.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let e = dev.current_stream().record_event().unwrap();
    /// assert!(e.to_html().contains("on cpu"));
    /// ```
    pub fn to_html(&self) -> String {
        format!(
            "<span style=\"font-family:monospace\"><b>Event</b> #{} on {}</span>",
            self.id().0,
            escape(&self.device().name())
        )
    }

    /// Shows the event in an evcxr notebook.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// dev.current_stream().record_event().unwrap().evcxr_display();
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        emit(&format!("{self:?}"), &self.to_html(), None);
    }
}
