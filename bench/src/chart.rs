//! The README chart: each figure's measured ratio against its goal.

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

/// (label, measured ratio, goal)
pub(crate) type Bar = (String, f64, f64);

/// The bars of a results CSV (the benchmark's `results.csv`): one per row with a goal, labelled
/// "figure (clients)".
pub(crate) fn bars(csv: &str) -> Vec<Bar> {
    csv.lines()
        .skip(1)
        .filter_map(|line| {
            let f = fields(line);
            let (figure, clients) = (f.first()?, f.get(1)?);
            // The ratio of the two rates where there are two (as the table prints it), else the
            // ratio column.
            let rates = f.get(3).zip(f.get(4)).and_then(|(b, o)| Some((b.parse::<f64>().ok()?, o.parse::<f64>().ok()?)));
            let ratio = match rates {
                Some((base, ours)) if base > 0.0 => ours / base,
                _ => f.get(5)?.parse().ok()?,
            };
            let goal: f64 = f.get(6)?.parse().ok()?;
            let label = if figure == "sweep rows per second" { "sweep rows/s (÷ 200k goal)".to_owned() } else { format!("{figure} ({clients})") };
            Some((label, ratio, goal))
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
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")?;
    register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
        .map_err(|_| "DejaVuSans.ttf is not a usable font")?;
    let height = 120 + 44 * bars.len() as u32;
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    // The axis stops at 2: a longer bar (the sweep, ~5x its goal) is cut there, its label says
    // how far it goes.
    let max = bars.iter().map(|b| b.1.max(b.2)).fold(1.0f64, f64::max).min(2.0) * 1.1;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(430)
        .build_cartesian_2d(0.0..max, (0..n).into_segmented())?;
    // Row i of `bars` is drawn at the top: segment n - 1 - i.
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(y) if *y < n => bars[n - 1 - *y].0.clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("ratio to the baseline measured in the same run (bar); goal (black tick)")
        .y_labels(n)
        .y_label_formatter(&label)
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, (_, value, goal)) in bars.iter().enumerate() {
        let y = n - 1 - i;
        let color = if value >= goal { RGBColor(46, 139, 87) } else { RGBColor(205, 92, 92) };
        let (top, bottom) = (SegmentValue::Exact(y), SegmentValue::Exact(y + 1));
        let shown = value.min(max / 1.1);
        chart.draw_series(std::iter::once(Rectangle::new([(0.0, top.clone()), (shown, bottom.clone())], color.filled())))?;
        chart.draw_series(std::iter::once(PathElement::new(vec![(*goal, top), (*goal, bottom)], BLACK.stroke_width(3))))?;
        chart.draw_series(std::iter::once(Text::new(format!("{value:.2}"), (shown + max * 0.01, SegmentValue::CenterOf(y)), ("sans-serif", 14))))?;
    }
    root.present()?;
    Ok(())
}
