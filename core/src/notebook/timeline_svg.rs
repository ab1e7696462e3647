//! A profile's timeline (or several devices' on one time axis: lanes for each device): one
//! lane for the host and one per stream, kernels and copies as bars
//! at their device times, the host's enqueue spans and waits on its lane with a dashed line
//! from each enqueue to the work it started (the gap between "returned" and "ran"), and
//! events as diamonds. Inline SVG with attributes only, on a light card so it reads the same
//! in a dark theme; every mark has a `<title>` (its tooltip) and a `class` naming what it is.

use super::html::escape;
use super::svg::Svg;
use crate::backend::StreamId;
use crate::profile::{Profile, ProfileRecord, RecordKind};
use std::fmt::Write;

const WIDTH: f64 = 880.0;
/// The lane labels' column.
const LABELS: f64 = 96.0;
const RIGHT: f64 = 16.0;
/// Room above the lanes: caption and legend.
const TOP: f64 = 46.0;
const LANE: f64 = 34.0;
const BAR: f64 = 18.0;
/// Room under the lanes: the time axis.
const AXIS: f64 = 34.0;
/// Dashed enqueue→start lines are drawn for profiles up to this many records.
const MAX_LINKS: usize = 300;

const KERNEL: &str = "#4c78a8";
const UPLOAD: &str = "#f58518";
const DOWNLOAD: &str = "#54a24b";
const HOST: &str = "#57606a";
const WAIT: &str = "#c9d1d9";
const COMPILE: &str = "#8250df";
const EVENT: &str = "#e45756";

impl Profile {
    /// The timeline picture (see the module notes): a host lane and one lane per stream,
    /// kernels (blue), uploads (orange) and downloads (green) as bars at their device times,
    /// enqueue spans, compiles (purple) and waits on the host lane, a dashed line from each
    /// enqueue to the work it started, events as red diamonds. Each bar's tooltip gives its ops, time, bytes and GB/s.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let p = dev.profile(|| {
    ///     let a = Tensor::ones([64], DType::F32, &dev)?;
    ///     a.exp()?.to_vec::<f32>()?;
    ///     Ok(())
    /// })?;
    /// let svg = p.timeline_svg().to_string();
    /// assert_eq!(svg.matches("class=\"bar kernel\"").count(), 2); // fill, exp
    /// assert_eq!(svg.matches("class=\"bar download\"").count(), 1);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn timeline_svg(&self) -> Svg {
        Svg(render(&[self]))
    }

    /// One timeline for the profiles of several devices recorded over the same span (a
    /// [`Profiler`](crate::Profiler) started on each device, the work, each stopped): a host
    /// lane and a lane per stream for each device, labelled with the device, on one time axis
    /// from the earliest profile's start (their `started` instants line them up), so copies
    /// between devices and work that overlaps across them show where they ran.
    ///
    /// ```
    /// use strata_core::{Device, DType, Profile, Tensor};
    /// let (a, b) = (Device::cpu(), Device::cpu());
    /// let (pa, pb) = (a.start_profiling()?, b.start_profiling()?);
    /// Tensor::ones([64], DType::F32, &a)?.exp()?.realize()?;
    /// Tensor::ones([64], DType::F32, &b)?.to_device(&a)?.realize()?;
    /// let (pa, pb) = (pa.stop()?, pb.stop()?);
    /// let svg = Profile::timeline_svg_of(&[&pa, &pb]).to_string();
    /// assert!(svg.contains(">cpu #0 host<") && svg.contains(">cpu #1 stream #0<"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn timeline_svg_of(profiles: &[&Profile]) -> Svg {
        Svg(render(profiles))
    }
}

/// A lane: the profile it belongs to, its stream (`None`: the host's), its label.
struct Lane {
    profile: usize,
    stream: Option<StreamId>,
    label: String,
}

/// The lanes of `profiles`: each one's host lane, then its streams'. One profile keeps the
/// plain labels; several are told apart by their device (`cuda:0`; `cpu #1` where two share
/// a name).
fn lanes(profiles: &[&Profile]) -> Vec<Lane> {
    let short = |p: &Profile| p.device.split(" (").next().unwrap_or("").to_string();
    let mut lanes = Vec::new();
    for (k, p) in profiles.iter().enumerate() {
        let prefix = if profiles.len() == 1 {
            String::new()
        } else if profiles.iter().filter(|q| short(q) == short(p)).count() > 1 {
            format!("{} #{k} ", short(p))
        } else {
            format!("{} ", short(p))
        };
        lanes.push(Lane {
            profile: k,
            stream: None,
            label: format!("{prefix}host"),
        });
        for s in p.streams() {
            lanes.push(Lane {
                profile: k,
                stream: Some(s),
                label: format!("{prefix}stream #{}", s.0),
            });
        }
    }
    lanes
}

/// A round step for axis ticks: about six over `span`.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 6.0).max(1e-3);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn time_label(us: f64, step: f64) -> String {
    if step >= 1000.0 {
        format!("{:.0} ms", us / 1000.0)
    } else if step >= 100.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if step >= 1.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.2} µs")
    }
}

/// The tooltip of a record.
fn tooltip(r: &ProfileRecord, p: &Profile) -> String {
    let mut t = format!("{} {}", r.kind.label(), r.name);
    if !r.ops.is_empty() {
        let _ = write!(t, ": {}", r.ops.join(" "));
    }
    if let Some(d) = r.device_us() {
        let _ = write!(t, " · {d:.1} µs on the device");
    }
    let _ = write!(
        t,
        " · enqueued at {:.1} µs, returned at {:.1} µs",
        r.host_start_us, r.host_end_us
    );
    if r.bytes_read + r.bytes_written > 0 {
        let _ = write!(
            t,
            " · {} read, {} written",
            crate::profile::table::bytes(r.bytes_read),
            crate::profile::table::bytes(r.bytes_written)
        );
    }
    if let Some(g) = r.gb_per_s() {
        let _ = write!(t, " · {g:.1} GB/s");
        if let Some(f) = p.fraction_of_copy_bandwidth(r) {
            let _ = write!(t, " ({:.0}% of copy bandwidth)", f * 100.0);
        }
    }
    if let Some(l) = &r.launch {
        let _ = write!(t, " · {l}");
    }
    escape(&t)
}

fn colour(kind: RecordKind) -> &'static str {
    match kind {
        RecordKind::Upload => UPLOAD,
        RecordKind::Download => DOWNLOAD,
        _ => KERNEL,
    }
}

fn render(profiles: &[&Profile]) -> String {
    let all = lanes(profiles);
    let lane_of = |k: usize, s: Option<StreamId>| {
        all.iter()
            .position(|l| l.profile == k && l.stream == s)
            .unwrap_or(0)
    };
    let lanes = all.len();
    // Each profile's times shifted onto the earliest one's clock.
    let first = profiles.iter().map(|p| p.started).min();
    let shift: Vec<f64> = profiles
        .iter()
        .map(|p| first.map_or(0.0, |f| (p.started - f).as_secs_f64() * 1e6))
        .collect();
    let height = TOP + lanes as f64 * LANE + AXIS;
    let span = profiles
        .iter()
        .zip(&shift)
        .filter(|(p, _)| !p.records.is_empty())
        .map(|(p, d)| p.span_us() + d)
        .fold(0.0, f64::max)
        .max(1e-3);
    // The label column fits the longest label.
    let longest = all
        .iter()
        .map(|l| l.label.chars().count())
        .max()
        .unwrap_or(0);
    let labels = LABELS.max(20.0 + 6.5 * longest as f64);
    let plot = WIDTH - labels - RIGHT;
    let x = |us: f64| labels + (us.max(0.0) / span) * plot;
    let lane_y = |lane: usize| TOP + lane as f64 * LANE;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect x=\"0.5\" y=\"0.5\" width=\"{}\" height=\"{}\" rx=\"6\" fill=\"#ffffff\" \
         stroke=\"#d0d7de\"/>",
        WIDTH - 1.0,
        height - 1.0
    );
    let device_us: f64 = profiles
        .iter()
        .flat_map(|p| p.device_work())
        .filter_map(ProfileRecord::device_us)
        .sum();
    let names: Vec<&str> = profiles.iter().map(|p| p.device.as_str()).collect();
    let _ = write!(
        s,
        "<text x=\"12\" y=\"18\" font-size=\"12\" fill=\"#24292f\">{}: {} kernels and copies, \
         {device_us:.1} µs on the {}, {span:.1} µs in all</text>",
        escape(&names.join(", ")),
        profiles
            .iter()
            .map(|p| p.device_work().count())
            .sum::<usize>(),
        if profiles.len() == 1 {
            "device"
        } else {
            "devices"
        }
    );
    // Legend.
    let legend = [
        (KERNEL, "kernel"),
        (UPLOAD, "host → device"),
        (DOWNLOAD, "device → host"),
        (HOST, "host enqueue"),
        (WAIT, "host waits"),
        (COMPILE, "compile"),
        (EVENT, "event"),
    ];
    let mut lx = 12.0;
    for (c, label) in legend {
        let _ = write!(
            s,
            "<rect x=\"{lx}\" y=\"27\" width=\"10\" height=\"10\" fill=\"{c}\"/>\
             <text x=\"{}\" y=\"36\" fill=\"#24292f\">{}</text>",
            lx + 14.0,
            escape(label)
        );
        lx += 24.0 + 6.5 * label.chars().count() as f64;
    }
    // Lanes and their labels.
    for (lane, l) in all.iter().enumerate() {
        let y = lane_y(lane);
        let fill = if lane % 2 == 0 { "#f6f8fa" } else { "#ffffff" };
        let _ = write!(
            s,
            "<rect x=\"{labels}\" y=\"{y}\" width=\"{plot}\" height=\"{LANE}\" fill=\"{fill}\"/>\
             <text x=\"12\" y=\"{}\" fill=\"#24292f\">{}</text>",
            y + LANE / 2.0 + 4.0,
            escape(&l.label)
        );
    }
    // The time axis.
    let axis_y = lane_y(lanes);
    let step = tick_step(span);
    let _ = write!(
        s,
        "<line x1=\"{labels}\" y1=\"{axis_y}\" x2=\"{}\" y2=\"{axis_y}\" stroke=\"#8c959f\"/>",
        labels + plot
    );
    let mut t = 0.0;
    while t <= span * 1.0001 {
        let tx = x(t);
        let _ = write!(
            s,
            "<line x1=\"{tx:.1}\" y1=\"{axis_y}\" x2=\"{tx:.1}\" y2=\"{}\" stroke=\"#8c959f\"/>\
             <text x=\"{tx:.1}\" y=\"{}\" text-anchor=\"middle\" fill=\"#57606a\">{}</text>",
            axis_y + 4.0,
            axis_y + 16.0,
            time_label(t, step)
        );
        t += step;
    }
    let links = profiles.iter().map(|p| p.records.len()).sum::<usize>() <= MAX_LINKS;
    for (k, p) in profiles.iter().enumerate() {
        draw_records(
            &mut s,
            p,
            shift[k],
            lane_y(lane_of(k, None)),
            links,
            &|us| x(us),
            &|st| lane_y(lane_of(k, Some(st))),
        );
    }
    s.push_str("</svg>");
    s
}

/// Draws profile `p`'s records, its times shifted by `shift` µs: host spans on its host lane
/// (top at `host_lane`), device work on its streams' lanes (`stream_lane`), through `x`.
fn draw_records(
    s: &mut String,
    p: &Profile,
    shift: f64,
    host_lane: f64,
    links: bool,
    x: &dyn Fn(f64) -> f64,
    stream_lane: &dyn Fn(StreamId) -> f64,
) {
    let x = |us: f64| x(us + shift);
    let host_top = host_lane + (LANE - BAR) / 2.0;
    for r in &p.records {
        let tip = tooltip(r, p);
        let (hx0, hx1) = (x(r.host_start_us), x(r.host_end_us));
        match r.kind {
            RecordKind::Synchronize | RecordKind::Compile => {
                let (class, fill) = if r.kind == RecordKind::Compile {
                    ("host compile", COMPILE)
                } else {
                    ("host wait", WAIT)
                };
                let _ = write!(
                    s,
                    "<rect class=\"{class}\" x=\"{hx0:.2}\" y=\"{host_top}\" width=\"{:.2}\" \
                     height=\"{BAR}\" fill=\"{fill}\"><title>{tip}</title></rect>",
                    (hx1 - hx0).max(1.0)
                );
            }
            kind if kind.is_device_work() => {
                // A download holds the host until its data is there: drawn as a wait.
                let fill = if kind == RecordKind::Download {
                    WAIT
                } else {
                    HOST
                };
                let _ = write!(
                    s,
                    "<rect class=\"host enqueue\" x=\"{hx0:.2}\" y=\"{host_top}\" width=\"{:.2}\" \
                     height=\"{BAR}\" fill=\"{fill}\"><title>{tip}</title></rect>",
                    (hx1 - hx0).max(1.0)
                );
                let (Some(d0), Some(d1)) = (r.device_start_us, r.device_end_us) else {
                    continue;
                };
                let y = stream_lane(r.stream) + (LANE - BAR) / 2.0;
                let (bx0, bx1) = (x(d0), x(d1));
                if links {
                    let _ = write!(
                        s,
                        "<line class=\"link\" x1=\"{hx0:.2}\" y1=\"{}\" x2=\"{bx0:.2}\" y2=\"{y}\" \
                         stroke=\"#8c959f\" stroke-dasharray=\"3,3\"/>",
                        host_top + BAR
                    );
                }
                let w = (bx1 - bx0).max(1.5);
                let _ = write!(
                    s,
                    "<rect class=\"bar {}\" x=\"{bx0:.2}\" y=\"{y}\" width=\"{w:.2}\" \
                     height=\"{BAR}\" fill=\"{}\"><title>{tip}</title></rect>",
                    kind.label(),
                    colour(kind)
                );
                let label = if r.ops.is_empty() {
                    r.name.clone()
                } else {
                    r.ops.join(" ")
                };
                let fits = (w / 6.2) as usize;
                if fits >= 4 {
                    let shown: String = if label.chars().count() > fits {
                        label.chars().take(fits - 1).chain(['…']).collect()
                    } else {
                        label
                    };
                    let _ = write!(
                        s,
                        "<text x=\"{:.2}\" y=\"{}\" fill=\"#ffffff\" pointer-events=\"none\">{}</text>",
                        bx0 + 3.0,
                        y + BAR / 2.0 + 4.0,
                        escape(&shown)
                    );
                }
            }
            RecordKind::EventRecord | RecordKind::EventWait => {
                let Some(at) = r.device_start_us else {
                    continue;
                };
                let (cx, cy) = (x(at), stream_lane(r.stream) + LANE / 2.0);
                let fill = if r.kind == RecordKind::EventRecord {
                    EVENT
                } else {
                    "#ffffff"
                };
                let _ = write!(
                    s,
                    "<polygon class=\"marker {}\" points=\"{cx:.2},{:.2} {:.2},{cy:.2} {cx:.2},{:.2} {:.2},{cy:.2}\" \
                     fill=\"{fill}\" stroke=\"{EVENT}\" stroke-width=\"1.5\"><title>{tip}</title></polygon>",
                    r.kind.label(),
                    cy - 7.0,
                    cx + 6.0,
                    cy + 7.0,
                    cx - 6.0
                );
            }
            _ => {}
        }
    }
}
