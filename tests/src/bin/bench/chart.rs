//! The README chart: each figure's measured ratio against its goal.

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

/// (label, measured ratio, goal)
pub type Bar = (String, f64, f64);

pub fn draw(path: &Path, title: &str, bars: &[Bar]) -> Result<(), Box<dyn std::error::Error>> {
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")?;
    register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
        .map_err(|_| "DejaVuSans.ttf is not a usable font")?;
    let height = 120 + 44 * bars.len() as u32;
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = bars.iter().map(|b| b.1.max(b.2)).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(430)
        .build_cartesian_2d(0.0..max, 0..bars.len())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("ratio to the baseline measured in the same run (bar); goal (black tick)")
        .y_labels(bars.len())
        .y_label_formatter(&|i| bars.get(bars.len().saturating_sub(1 + *i)).map(|b| b.0.clone()).unwrap_or_default())
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, (_, value, goal)) in bars.iter().enumerate() {
        let y = bars.len() - 1 - i;
        let met = value >= goal;
        let color = if met { RGBColor(46, 139, 87) } else { RGBColor(205, 92, 92) };
        chart.draw_series(std::iter::once(Rectangle::new([(0.0, y), (*value, y + 1)], color.filled())))?;
        chart.draw_series(std::iter::once(PathElement::new(vec![(*goal, y), (*goal, y + 1)], BLACK.stroke_width(3))))?;
        chart.draw_series(std::iter::once(Text::new(format!("{value:.2}"), (*value + max * 0.01, y), ("sans-serif", 14))))?;
    }
    root.present()?;
    Ok(())
}
