//! A picture as SVG text: what the layout, timeline and graph pictures return. A notebook
//! shows it as a picture; `to_string()` and [`as_str`](Svg::as_str) give the SVG.

/// An SVG picture ([`Tensor::layout_svg`](crate::Tensor::layout_svg),
/// [`Profile::timeline_svg`](crate::Profile::timeline_svg)).
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let t = Tensor::zeros([2, 3], DType::F32, &Device::cpu())?;
/// let svg = t.layout_svg();
/// assert!(svg.as_str().starts_with("<svg") && svg.to_string().ends_with("</svg>"));
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Svg(pub(crate) String);

impl Svg {
    /// The SVG document.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::zeros([4], DType::U8, &Device::cpu())?;
    /// assert!(t.layout_svg().as_str().ends_with("</svg>"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Shows the picture in an evcxr notebook (`image/svg+xml`, with the SVG as text too).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// Tensor::zeros([2], DType::F32, &Device::cpu())?.layout_svg().evcxr_display();
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        print!(
            "EVCXR_BEGIN_CONTENT text/plain\n{0}\nEVCXR_END_CONTENT\n\
             EVCXR_BEGIN_CONTENT image/svg+xml\n{0}\nEVCXR_END_CONTENT\n",
            self.0
        );
    }
}

impl std::fmt::Display for Svg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
