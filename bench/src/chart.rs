//! The README chart: each figure's measured ratio against its goal.

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

/// Registers the charts' font once.
fn font() -> Result<(), Box<dyn std::error::Error>> {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if DONE.get().is_none() {
        let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")?;
        register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
            .map_err(|_| "DejaVuSans.ttf is not a usable font")?;
        let _ = DONE.set(());
    }
    Ok(())
}

/// (label, measured ratio, goal if the row has one, whether the goal is a ceiling)
pub(crate) type Bar = (String, f64, Option<f64>, bool);

/// The bars of a results CSV (the benchmark's `results.csv`): one per row with a ratio, labelled
/// "figure (clients)"; a row without a goal is drawn grey, without a tick.
pub(crate) fn bars(csv: &str) -> Vec<Bar> {
    csv.lines()
        .skip(1)
        .filter_map(|line| {
            let f = fields(line);
            let (figure, clients) = (f.first()?, f.get(1)?);
            // The ratio column, as the table prints it (the rates in the CSV are rounded).
            let ratio: f64 = f.get(5)?.parse().ok()?;
            let goal: Option<f64> = f.get(6).and_then(|g| g.parse().ok());
            let label = if figure == "sweep rows per second" { "sweep rows/s (÷ 200k goal)".to_owned() } else { format!("{figure} ({clients})") };
            // The soak's goal is a ceiling (size growth at most its goal, 1.15x), and so are the latency
            // rows' (our p50 over the baseline's); every other one a floor.
            Some((label, ratio, goal, figure.starts_with("soak:") || figure.starts_with("latency ")))
        })
        .collect()
}

/// The fields of one CSV line (double-quoted fields may hold commas).
fn fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

pub(crate) fn draw(path: &Path, title: &str, bars: &[Bar]) -> Result<(), Box<dyn std::error::Error>> {
    font()?;
    let height = 120 + 44 * bars.len() as u32;
    let root = BitMapBackend::new(path, (1300, height)).into_drawing_area();
    root.fill(&WHITE)?;
    // The axis stops at 2: a longer bar (the sweep, ~5x its goal) is cut there, its label says
    // how far it goes.
    let max = bars.iter().map(|b| b.1.max(b.2.unwrap_or(0.0))).fold(1.0f64, f64::max).min(2.0) * 1.1;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(670)
        .build_cartesian_2d(0.0..max, (0..n).into_segmented())?;
    // Row i of `bars` is drawn at the top: segment n - 1 - i.
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(y) if *y < n => bars[n - 1 - *y].0.clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("ratio to the baseline of the same run (bar; grey: no goal); goal (black tick; the soak's and latency's are ceilings)")
        .y_labels(n)
        .y_label_formatter(&label)
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, (_, value, goal, ceiling)) in bars.iter().enumerate() {
        let y = n - 1 - i;
        let met = goal.map(|goal| if *ceiling { *value <= goal } else { *value >= goal });
        let color = match met {
            Some(true) => RGBColor(46, 139, 87),
            Some(false) => RGBColor(205, 92, 92),
            None => RGBColor(160, 160, 160),
        };
        let (top, bottom) = (SegmentValue::Exact(y), SegmentValue::Exact(y + 1));
        let shown = value.min(max / 1.1);
        chart.draw_series(std::iter::once(Rectangle::new([(0.0, top.clone()), (shown, bottom.clone())], color.filled())))?;
        if let Some(goal) = goal {
            chart.draw_series(std::iter::once(PathElement::new(vec![(*goal, top), (*goal, bottom)], BLACK.stroke_width(3))))?;
        }
        chart.draw_series(std::iter::once(Text::new(format!("{value:.3}"), (shown + max * 0.01, SegmentValue::CenterOf(y)), ("sans-serif", 14))))?;
    }
    root.present()?;
    Ok(())
}

/// The soak chart: table + index size (kB) after each cycle, and the plateau limit (a horizontal
/// line at `limit` kB, labelled `limit_label`).
pub(crate) fn sizes(path: &Path, title: &str, kb: &[f64], limit: f64, limit_label: &str) -> Result<(), Box<dyn std::error::Error>> {
    font()?;
    let root = BitMapBackend::new(path, (1100, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = kb.iter().copied().fold(limit, f64::max) * 1.15;
    let n = kb.len().max(2);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(1usize..n, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("cycle (reserve/complete/release, expire, sweep by the maintenance worker)")
        .y_desc("idem_records + idem_retries + indexes, kB")
        .label_style(("sans-serif", 15))
        .draw()?;
    chart
        .draw_series(LineSeries::new(kb.iter().enumerate().map(|(i, v)| (i + 1, *v)), RGBColor(46, 139, 87).stroke_width(2)))?
        .label("size after the cycle")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(46, 139, 87).stroke_width(2)));
    chart
        .draw_series(LineSeries::new([(1, limit), (n, limit)], RGBColor(205, 92, 92).stroke_width(2)))?
        .label(limit_label)
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(205, 92, 92).stroke_width(2)));
    chart.configure_series_labels().background_style(WHITE).border_style(BLACK).label_font(("sans-serif", 15)).position(SeriesLabelPosition::LowerRight).draw()?;
    root.present()?;
    Ok(())
}
