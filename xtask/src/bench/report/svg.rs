//! The report's chart as SVG, drawn with plotters: one row per figure with a ratio, one
//! bar per ratio, and a parity line at 1.0.

use std::io;

use plotters::{
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::{Contender, Figure, RATIOS, Report, Value, ratio};

const WIDTH: u32 = 900;
const ROW_HEIGHT: u32 = 50;
const COLORS: [RGBColor; 2] = [RGBColor(0x1f, 0x77, 0xb4), RGBColor(0xff, 0x7f, 0x0e)];
const GREY: RGBColor = RGBColor(0x70, 0x70, 0x70);
/// y units per chart row: the y axis is integer so that it can take one tick per row.
const ROW: i32 = 100;

/// One row of the chart: a figure's two ratios, or why a bar cannot be drawn.
struct Row<'a> {
    name: &'a str,
    bars: [Result<f64, &'static str>; 2],
}

/// The chart as SVG text: one row per figure with a ratio, one bar per ratio.
pub fn render_svg(report: &Report) -> Result<String, String> {
    let rows: Vec<Row<'_>> = report
        .figures
        .iter()
        .map(|figure| Row {
            name: &figure.name,
            bars: RATIOS.map(|(den, _, _)| {
                ratio(figure, Contender::EbpfCni, den).ok_or_else(|| no_ratio_reason(figure, den))
            }),
        })
        .filter(|row| row.bars.iter().any(Result::is_ok))
        .collect();
    let mut svg = String::new();
    let drawn = if rows.is_empty() {
        draw_empty(&mut svg, &report.title)
    } else {
        draw_chart(&mut svg, &report.title, &rows)
    };
    drawn.map_err(|e| format!("drawing the chart: {e}"))?;
    Ok(svg)
}

fn no_ratio_reason(figure: &Figure, denominator: Contender) -> &'static str {
    let values = [Contender::EbpfCni, denominator].map(|c| figure.value(c));
    if values.contains(&Some(&Value::NotApplicable)) {
        "n/a"
    } else if values.iter().all(|v| matches!(v, Some(Value::Measured(_)))) {
        "no ratio (zero)"
    } else {
        "missing"
    }
}

type DrawResult = Result<(), DrawingAreaErrorKind<io::Error>>;

fn text_style(size: u32, h: HPos) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(h, VPos::Center))
}

fn draw_empty(svg: &mut String, title: &str) -> DrawResult {
    let root = SVGBackend::with_string(svg, (WIDTH, 120)).into_drawing_area();
    root.fill(&WHITE)?;
    let middle = WIDTH as i32 / 2;
    root.draw(&Text::new(
        title,
        (middle, 35),
        text_style(22, HPos::Center),
    ))?;
    let style = text_style(18, HPos::Center).color(&GREY);
    root.draw(&Text::new("no ratios measured yet", (middle, 80), style))?;
    root.present()
}

fn draw_chart(svg: &mut String, title: &str, rows: &[Row<'_>]) -> DrawResult {
    let n = rows.len() as i32;
    let height = 120 + ROW_HEIGHT * rows.len() as u32;
    let root = SVGBackend::with_string(svg, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(60);
    let middle = WIDTH as i32 / 2;
    header.draw(&Text::new(
        title,
        (middle, 18),
        text_style(22, HPos::Center),
    ))?;
    // The legend goes above the plot, where no bar can run into it.
    for (i, (_, _, label)) in RATIOS.iter().enumerate() {
        let x = middle - 250 + 280 * i as i32;
        header.draw(&Rectangle::new([(x, 40), (x + 16, 52)], COLORS[i].filled()))?;
        header.draw(&Text::new(*label, (x + 22, 46), text_style(16, HPos::Left)))?;
    }

    let widest = rows.iter().map(|row| row.name.chars().count()).max();
    let label_area = (widest.unwrap_or(0) as u32 * 8 + 24).clamp(100, 340);
    let bars = rows.iter().flat_map(|row| row.bars.iter().flatten());
    // Room past the longest bar for its label, and 1.0 always in sight.
    let x_max = bars.fold(1.0_f64, |a, &b| a.max(b)) * 1.18;
    // Row i from the top is centred on `centre(i)`.
    let centre = |i: usize| (n - i as i32) * ROW - ROW / 2;
    let mut chart = ChartBuilder::on(&body)
        .margin_right(30)
        .margin_bottom(5)
        .x_label_area_size(45)
        .y_label_area_size(label_area)
        .build_cartesian_2d(
            0.0..x_max,
            (0..n * ROW).with_key_points((0..rows.len()).map(centre).collect()),
        )?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_max_light_lines(1)
        .x_desc("ratio (> 1 = ebpf-cni better)")
        .y_label_formatter(&|y| {
            let i = ((n * ROW - y) / ROW) as usize;
            rows.get(i)
                .map(|row| row.name.to_owned())
                .unwrap_or_default()
        })
        .x_label_formatter(&|x| format!("{x:.1}"))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;

    // Drawn first, so that the value labels stay on top of it.
    let parity = ShapeStyle::from(&BLACK).stroke_width(2);
    chart.draw_series([PathElement::new([(1.0, 0), (1.0, n * ROW)], parity)])?;
    for (i, row) in rows.iter().enumerate() {
        for (j, bar) in row.bars.iter().enumerate() {
            // The first bar above the row's centre line, the second below it.
            let y = centre(i) + if j == 0 { ROW / 5 } else { -ROW / 5 };
            let label = match *bar {
                Ok(r) => {
                    let rect = Rectangle::new([(0.0, y - 17), (r, y + 17)], COLORS[j].filled());
                    chart.draw_series([rect])?;
                    EmptyElement::at((r, y))
                        + Text::new(format!("{r:.2}x"), (5, 0), text_style(15, HPos::Left))
                }
                Err(why) => {
                    let style = text_style(15, HPos::Left).color(&GREY);
                    EmptyElement::at((0.0, y)) + Text::new(why.to_owned(), (5, 0), style)
                }
            };
            chart.draw_series([label])?;
        }
    }
    root.present()
}
