//! The profile as a text table (what `println!("{profile}")` and `STRATA_PROFILE=1` print),
//! and the number formats the notebook table shares.

use super::{Profile, ProfileRecord};
use std::fmt::{self, Write};

/// `1.5 KiB`, `12 MiB`: bytes for a reader.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else if v < 10.0 {
        format!("{v:.1} {}", UNITS[unit])
    } else {
        format!("{v:.0} {}", UNITS[unit])
    }
}

/// Microseconds with one decimal, or `-` when unknown.
pub(crate) fn us(t: Option<f64>) -> String {
    t.map_or("-".into(), |t| format!("{t:.1}"))
}

/// The cells of one record's row: what the text and HTML tables show.
pub(crate) struct Row {
    pub(crate) cells: [String; 12],
}

/// Column headings, beside [`Row::cells`].
pub(crate) const HEADINGS: [&str; 12] = [
    "#",
    "what",
    "kernel",
    "ops",
    "stream",
    "enqueued µs",
    "started µs",
    "device µs",
    "read",
    "written",
    "GB/s",
    "GFLOP/s",
];

impl Row {
    pub(crate) fn of(k: usize, r: &ProfileRecord, p: &Profile) -> Row {
        let moved = |n: u64| if n == 0 { String::new() } else { bytes(n) };
        let gbs = r
            .gb_per_s()
            .map_or(String::new(), |g| match p.fraction_of_copy_bandwidth(r) {
                Some(f) => format!("{g:.1} ({:.0}%)", f * 100.0),
                None => format!("{g:.1}"),
            });
        Row {
            cells: [
                k.to_string(),
                r.kind.label().to_string(),
                r.name.clone(),
                r.ops.join(" "),
                format!("#{}", r.stream.0),
                us(Some(r.host_start_us)),
                us(r.device_start_us),
                if r.kind.is_device_work() {
                    us(r.device_us())
                } else if r.host_end_us > r.host_start_us {
                    format!("(host {:.1})", r.host_end_us - r.host_start_us)
                } else {
                    String::new()
                },
                moved(r.bytes_read),
                moved(r.bytes_written),
                gbs,
                r.gflop_per_s().map_or(String::new(), |g| format!("{g:.1}")),
            ],
        }
    }
}

/// The caption: device, timing and the copy bandwidth the percentages refer to.
pub(crate) fn caption(p: &Profile) -> String {
    let device_us: f64 = p.device_work().filter_map(ProfileRecord::device_us).sum();
    let mut s = format!(
        "profile of {}: {} records, {} kernels and copies, {:.1} µs of device work",
        p.device,
        p.records.len(),
        p.device_work().count(),
        device_us
    );
    if let Some(b) = p.copy_bandwidth_gb_per_s {
        let _ = write!(s, "; GB/s in % of the device's copy bandwidth, {b:.1} GB/s");
    }
    s
}

/// The whole table as aligned text.
pub(crate) fn text(p: &Profile) -> String {
    let rows: Vec<Row> = p
        .records
        .iter()
        .enumerate()
        .map(|(k, r)| Row::of(k, r, p))
        .collect();
    let mut widths = HEADINGS.map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(&row.cells) {
            *w = (*w).max(c.chars().count()).min(40);
        }
    }
    let mut out = caption(p);
    let _ = write!(out, "\n{}\n", p.timing);
    let line = |cells: Vec<&str>, out: &mut String| {
        for (k, (c, w)) in cells.iter().zip(&widths).enumerate() {
            let c: String = c.chars().take(*w).collect();
            let pad = w - c.chars().count();
            // Text columns to the left, numbers to the right.
            if (1..=4).contains(&k) {
                let _ = write!(out, "{c}{} ", " ".repeat(pad));
            } else {
                let _ = write!(out, "{}{c} ", " ".repeat(pad));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    };
    line(HEADINGS.to_vec(), &mut out);
    for row in &rows {
        line(row.cells.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&text(self))
    }
}
