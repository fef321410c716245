//! The storm demo's pictures (plotters, SVG): dependency calls per second.

use plotters::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

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
