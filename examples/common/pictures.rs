//! The pictures of the demos (plotters, SVG): the episode simulator's rates per policy, and the
//! storm demo's dependency calls per second.

use plotters::prelude::*;

const BARS: [(&str, RGBColor); 3] = [
    ("episodes with a duplicate effect", RGBColor(214, 39, 40)),
    ("... reported as success", RGBColor(255, 152, 150)),
    (
        "episodes escalated (outcome unknown)",
        RGBColor(31, 119, 180),
    ),
];

/// One policy's rates, as fractions of its episodes.
pub struct Rates {
    pub policy: &'static str,
    pub episodes: u32,
    pub duplicated: f64,
    pub silent: f64,
    pub escalated: f64,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Writes `episodes.svg` into `dir`: duplicate, silent-duplicate and escalation rates per policy.
#[allow(dead_code)]
pub fn rates(dir: &std::path::Path, rows: &[Rates]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("episodes.svg");
    let root = SVGBackend::new(&path, (820, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = rows
        .iter()
        .flat_map(|r| [r.duplicated, r.escalated])
        .fold(0.0f64, f64::max);
    let top = ((top * 100.0 / 10.0).ceil() * 10.0).max(10.0);
    let episodes = rows.first().map_or(0, |r| r.episodes);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Agent episodes ({episodes} per policy, same faults): duplicates and escalations"
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..rows.len() as f64, 0f64..top)?;
    let names: Vec<&str> = rows.iter().map(|r| r.policy).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 1e-6 && i < names.len() {
                names[i].to_string()
            } else {
                String::new()
            }
        })
        .y_desc("% of episodes")
        .draw()?;
    for (k, (label, color)) in BARS.iter().enumerate() {
        let bars = rows.iter().enumerate().map(|(i, r)| {
            let value = 100.0
                * match k {
                    0 => r.duplicated,
                    1 => r.silent,
                    _ => r.escalated,
                };
            let x0 = i as f64 + 0.15 + k as f64 * 0.24;
            Rectangle::new([(x0, 0.0), (x0 + 0.22, value)], color.filled())
        });
        chart
            .draw_series(bars)?
            .label(*label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One stack's dependency calls in each second of a scenario.
pub struct Series {
    pub stack: &'static str,
    pub per_second: Vec<u64>,
}

/// Writes `name` into `dir`: dependency calls per second over time, one line per stack, on a
/// log scale (an outage under tower's nested retries is thousands a second, under a breaker a
/// handful).
#[allow(dead_code)]
pub fn calls_per_second(
    dir: &std::path::Path,
    name: &str,
    title: &str,
    series: &[Series],
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    let root = SVGBackend::new(&path, (820, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let secs = series.iter().map(|s| s.per_second.len()).max().unwrap_or(1) as f64;
    let top = series
        .iter()
        .flat_map(|s| s.per_second.iter().copied())
        .max()
        .unwrap_or(1)
        .max(10) as f64
        * 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..secs, (0.5f64..top).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("dependency calls per second")
        .draw()?;
    let colors = [
        RGBColor(127, 127, 127),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
    ];
    for (i, s) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        // A second with no call is drawn at the bottom of the scale.
        let points = s
            .per_second
            .iter()
            .enumerate()
            .map(|(t, &n)| (t as f64 + 0.5, (n as f64).max(0.5)));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(s.stack)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
