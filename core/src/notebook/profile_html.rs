//! A profile in a notebook: its caption, the timeline picture, then the table of records
//! (the same cells as the text table).

use super::html::escape;
use crate::profile::table::{caption, Row, HEADINGS};
use crate::profile::Profile;
use std::fmt::Write;

const TABLE_STYLE: &str =
    "border-collapse:collapse;font-family:monospace;font-size:11px;margin:4px 0";
const HEAD_STYLE: &str = "text-align:left;padding:1px 6px;border-bottom:1px solid #8c959f";
const CELL_STYLE: &str = "padding:1px 6px;white-space:nowrap";
/// Rows shown at most; the text display and the Chrome trace have them all.
const MAX_ROWS: usize = 200;

impl Profile {
    /// The notebook view: caption, timing note, the timeline and the table of records (up to
    /// 200 rows).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let p = dev.profile(|| Tensor::ones([8], DType::F32, &dev).map(|_| ()))?;
    /// let html = p.to_html();
    /// assert!(html.contains("<svg") && html.contains("<table"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn to_html(&self) -> String {
        let mut out = format!(
            "<div class=\"strata-profile\"><div style=\"font-family:monospace;margin-bottom:2px\">\
             <b>{}</b></div><div style=\"font-family:monospace;font-size:11px;color:#57606a\">{}</div>\
             <div style=\"margin:4px 0\">{}</div><table style=\"{TABLE_STYLE}\"><tr>",
            escape(&caption(self)),
            escape(&self.timing),
            self.timeline_svg()
        );
        for h in HEADINGS {
            let _ = write!(out, "<th style=\"{HEAD_STYLE}\">{}</th>", escape(h));
        }
        out.push_str("</tr>");
        for (k, r) in self.records.iter().enumerate().take(MAX_ROWS) {
            out.push_str("<tr>");
            for (c, cell) in Row::of(k, r, self).cells.iter().enumerate() {
                let align = if (1..=4).contains(&c) {
                    "left"
                } else {
                    "right"
                };
                let _ = write!(
                    out,
                    "<td style=\"{CELL_STYLE};text-align:{align}\">{}</td>",
                    escape(cell)
                );
            }
            out.push_str("</tr>");
        }
        out.push_str("</table>");
        if self.records.len() > MAX_ROWS {
            let _ = write!(
                out,
                "<div style=\"font-family:monospace;font-size:11px\">… {} more records \
                 (println!(\"{{profile}}\") or save_chrome_trace shows them all)</div>",
                self.records.len() - MAX_ROWS
            );
        }
        out.push_str("</div>");
        out
    }

    /// Shows the profile in an evcxr notebook (HTML, with the text table as plain text).
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// dev.profile(|| Ok(()))?.evcxr_display();
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    #[cfg(feature = "evcxr")]
    pub fn evcxr_display(&self) {
        print!(
            "EVCXR_BEGIN_CONTENT text/plain\n{}\nEVCXR_END_CONTENT\n\
             EVCXR_BEGIN_CONTENT text/html\n{}\nEVCXR_END_CONTENT\n",
            self,
            self.to_html()
        );
    }
}
