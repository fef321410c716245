//! [`Report::svg`]: the rates of several runs of the harness side by side, as an SVG picture
//! (written by hand: no plotting dependency in the library).

use super::episodes::Report;
use std::fmt::Write;

/// One bar of a run: its legend, its colour and the count it shows (per episode).
type Bar = (&'static str, &'static str, fn(&Report) -> u64);

/// The bars of each run.
const BARS: [Bar; 3] = [
    ("duplicate effects", "#d62728", |r| r.duplicate_effects),
    ("... in a run that reported success", "#ff9896", |r| {
        r.silent_duplicates
    }),
    ("escalations", "#1f77b4", |r| r.escalations.values().sum()),
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Report {
    /// The duplicate effects, silent duplicates and escalations per episode of each named run
    /// (a policy, a tool table, before and after a fix), as grouped bars in an SVG document.
    ///
    /// ```
    /// use stormguard::chaos::Report;
    ///
    /// let sound = Report::default();
    /// let svg = Report::svg(&[("receipts in SQLite", &sound), ("receipts in memory", &sound)]);
    /// assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    /// assert!(svg.contains("receipts in memory"));
    /// ```
    pub fn svg(runs: &[(&str, &Report)]) -> String {
        let (width, height, left, top, bottom) = (760.0, 380.0, 60.0, 40.0, 300.0);
        let rate =
            |r: &Report, pick: fn(&Report) -> u64| pick(r) as f64 / f64::from(r.episodes.max(1));
        let highest = runs
            .iter()
            .flat_map(|(_, r)| BARS.iter().map(move |(_, _, pick)| rate(r, *pick)))
            .fold(0.0f64, f64::max);
        // The axis ends at the next tenth above the highest rate (at least 0.1).
        let scale = ((highest * 10.0).ceil() / 10.0).max(0.1);
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            out,
            r#"<text x="{left}" y="20" font-size="14">per episode (axis up to {scale:.1})</text>"#
        );
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/>"##,
            width - 20.0
        );
        let group = (width - left - 20.0) / runs.len().max(1) as f64;
        let bar = group / (BARS.len() as f64 + 1.0);
        for (i, (name, report)) in runs.iter().enumerate() {
            let x0 = left + group * i as f64 + bar / 2.0;
            for (j, (_, colour, pick)) in BARS.iter().enumerate() {
                let value = rate(report, *pick);
                let h = (bottom - top) * value / scale;
                let x = x0 + bar * j as f64;
                let _ = writeln!(
                    out,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{colour}"><title>{value:.4}</title></rect>"#,
                    bottom - h,
                    bar * 0.9
                );
            }
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                x0 + bar * BARS.len() as f64 / 2.0,
                bottom + 18.0,
                escape(name)
            );
        }
        for (j, (legend, colour, _)) in BARS.iter().enumerate() {
            let y = bottom + 40.0 + 16.0 * j as f64;
            let _ = writeln!(
                out,
                r#"<rect x="{left}" y="{}" width="10" height="10" fill="{colour}"/><text x="{}" y="{y}">{}</text>"#,
                y - 10.0,
                left + 16.0,
                escape(legend)
            );
        }
        out.push_str("</svg>\n");
        out
    }
}
