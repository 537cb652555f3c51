//! The benchmark report: the data model every bench figure is recorded in, and its two
//! renderings, a Markdown page with one table and an SVG chart of the ratios it links to.
//! Nothing here measures or estimates: a figure that was not measured shows why, and
//! never takes part in a ratio.

use std::{fmt::Write as _, fs, io, path::Path};

use plotters::{
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

/// Who is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Contender {
    EbpfCni,
    Reference,
    Raw,
}

impl Contender {
    /// The order of the table's columns.
    pub const ALL: [Contender; 3] = [Contender::EbpfCni, Contender::Reference, Contender::Raw];

    /// The full name, as a reader of the report needs it.
    pub fn label(self) -> &'static str {
        match self {
            Contender::EbpfCni => "ebpf-cni",
            Contender::Reference => "reference (bridge + host-local + portmap)",
            Contender::Raw => "raw veth (ceiling)",
        }
    }

    /// The name in a table header, where the long labels would not fit.
    fn short_label(self) -> &'static str {
        match self {
            Contender::EbpfCni => "ebpf-cni",
            Contender::Reference => "reference",
            Contender::Raw => "raw veth",
        }
    }
}

/// Median, min and max over the repeated runs of one figure for one contender.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Stats {
    /// `None` when there is no sample left after dropping NaNs (a failed run's reading).
    pub fn from_samples(samples: &[f64]) -> Option<Stats> {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|s| !s.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        let mid = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) {
            (sorted[mid - 1] + sorted[mid]) / 2.0
        } else {
            sorted[mid]
        };
        Some(Stats {
            median,
            min,
            max,
            runs: sorted.len(),
        })
    }
}

/// One contender's result for one figure.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Measured(Stats),
    /// The figure means nothing for this contender (e.g. daemon memory for raw veth).
    NotApplicable,
    /// The figure should exist but could not be measured; the string says why.
    Missing(String),
}

/// One row of the report: a quantity measured for each contender.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub name: String,
    pub unit: String,
    pub higher_is_better: bool,
    pub values: Vec<(Contender, Value)>,
}

impl Figure {
    /// The first value recorded for `contender`, if any.
    pub fn value(&self, contender: Contender) -> Option<&Value> {
        self.values
            .iter()
            .find(|(c, _)| *c == contender)
            .map(|(_, value)| value)
    }

    fn median(&self, contender: Contender) -> Option<f64> {
        match self.value(contender)? {
            Value::Measured(stats) => Some(stats.median),
            Value::NotApplicable | Value::Missing(_) => None,
        }
    }
}

/// A whole benchmark run, with what is needed to reproduce it.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub title: String,
    pub date: String,
    pub commit: String,
    pub machine: String,
    pub kernel: String,
    pub command: String,
    pub notes: Vec<String>,
    pub figures: Vec<Figure>,
}

/// The "better-is-bigger" ratio of `numerator` to `denominator`: medians divided for a
/// higher-is-better figure, inverted for a lower-is-better one (times, memory), so that
/// above 1.0 always means the numerator is better. `None` unless both sides are measured
/// with a finite, positive median.
pub fn ratio(figure: &Figure, numerator: Contender, denominator: Contender) -> Option<f64> {
    let num = figure.median(numerator)?;
    let den = figure.median(denominator)?;
    let usable = |m: f64| m.is_finite() && m > 0.0;
    if !usable(num) || !usable(den) {
        return None;
    }
    Some(if figure.higher_is_better {
        num / den
    } else {
        den / num
    })
}

/// The two ratios of the report, each with its column header and chart legend.
const RATIOS: [(Contender, &str, &str); 2] = [
    (
        Contender::Reference,
        "ebpf-cni vs reference",
        "ebpf-cni vs reference",
    ),
    (
        Contender::Raw,
        "ebpf-cni vs raw",
        "ebpf-cni vs raw veth (ceiling)",
    ),
];

/// The Markdown page; `chart_file_name` is linked as is, so it is a path from the page's
/// folder (see [`write`]).
pub fn render_markdown(report: &Report, chart_file_name: &str) -> String {
    let mut md = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(md, "# {}\n", report.title);
    let _ = writeln!(
        md,
        "Date: {} · commit: `{}` · machine: {} · kernel: {}\n",
        report.date, report.commit, report.machine, report.kernel
    );
    let _ = writeln!(md, "```sh\n{}\n```\n", report.command);
    for note in &report.notes {
        let _ = writeln!(md, "- {note}");
    }
    if !report.notes.is_empty() {
        md.push('\n');
    }

    let mut header = vec!["figure", "unit"];
    header.extend(Contender::ALL.map(Contender::short_label));
    header.extend(RATIOS.map(|(_, column, _)| column));
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let _ = writeln!(md, "| --- | --- |{}", " ---: |".repeat(header.len() - 2));
    for figure in &report.figures {
        let mut row = vec![cell(&figure.name), cell(&figure.unit)];
        row.extend(Contender::ALL.map(|c| cell(&value_text(figure, c))));
        row.extend(RATIOS.map(|(den, _, _)| ratio_text(ratio(figure, Contender::EbpfCni, den))));
        let _ = writeln!(md, "| {} |", row.join(" | "));
    }

    let _ = writeln!(
        md,
        "\nEach cell is the median of the runs, with the lowest and highest in \
         parentheses. A ratio above 1.00x means ebpf-cni is better (faster, quicker or \
         smaller), whichever way the unit goes; — means no ratio, as a side was not \
         measured or does not apply. Contenders: {}.\n",
        Contender::ALL.map(Contender::label).join("; ")
    );
    let target = if chart_file_name.contains([' ', '(', ')']) {
        format!("<{chart_file_name}>")
    } else {
        chart_file_name.to_owned()
    };
    let _ = writeln!(
        md,
        "![ebpf-cni ratios against the reference and raw veth]({target})"
    );
    md
}

fn value_text(figure: &Figure, contender: Contender) -> String {
    match figure.value(contender) {
        // A single run has no spread to show, and saying so beats "30.0 (30.0–30.0)".
        Some(Value::Measured(s)) if s.runs == 1 => format!("{} (1 run)", number(s.median)),
        Some(Value::Measured(s)) => {
            format!("{} ({}–{})", number(s.median), number(s.min), number(s.max))
        }
        Some(Value::NotApplicable) => "n/a".to_owned(),
        Some(Value::Missing(why)) => format!("missing: {why}"),
        None => "missing: not recorded".to_owned(),
    }
}

fn ratio_text(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}x"))
}

/// Three significant digits, or the whole number from 100 up (12345 ops/s, not 12300).
fn number(value: f64) -> String {
    if !value.is_finite() || value == 0.0 || value.abs() >= 99.95 {
        return format!("{value:.0}");
    }
    let magnitude = value.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).max(0) as usize;
    // 9.996 rounds to 10.00: one decimal fewer keeps three significant digits.
    let rounded = format!("{value:.decimals$}");
    let digits = rounded.trim_start_matches(['-', '0', '.']).replace('.', "");
    if digits.len() > 3 && decimals > 0 {
        format!("{value:.0$}", decimals - 1)
    } else {
        rounded
    }
}

/// A table cell must not end the row early.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

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

/// Writes the Markdown page and its chart, creating their folders. The page links the
/// chart by its file name, or by its path from the page's folder when the chart sits
/// below it (`BENCHMARKS.md` beside `docs/`), so that the link works either way.
pub fn write(report: &Report, markdown_path: &Path, svg_path: &Path) -> io::Result<()> {
    let link = chart_link(markdown_path, svg_path)?;
    let svg = render_svg(report).map_err(io::Error::other)?;
    for path in [markdown_path, svg_path] {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent)?;
        }
    }
    fs::write(svg_path, svg)?;
    fs::write(markdown_path, render_markdown(report, &link))
}

fn chart_link(markdown_path: &Path, svg_path: &Path) -> io::Result<String> {
    let unusable = || io::Error::other(format!("{}: not a usable chart path", svg_path.display()));
    let page_dir = markdown_path.parent().unwrap_or(Path::new(""));
    let below = svg_path.strip_prefix(page_dir).ok().filter(|rest| {
        rest.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
    });
    let relative = below.unwrap_or(Path::new(svg_path.file_name().ok_or_else(unusable)?));
    let parts: Option<Vec<&str>> = relative.iter().map(|part| part.to_str()).collect();
    // Markdown links take forward slashes whatever the platform.
    Ok(parts.ok_or_else(unusable)?.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(median: f64) -> Value {
        Value::Measured(Stats {
            median,
            min: median * 0.9,
            max: median * 1.1,
            runs: 5,
        })
    }

    fn figure(name: &str, unit: &str, higher_is_better: bool, values: [Value; 3]) -> Figure {
        Figure {
            name: name.to_owned(),
            unit: unit.to_owned(),
            higher_is_better,
            values: Contender::ALL.into_iter().zip(values).collect(),
        }
    }

    fn sample() -> Report {
        Report {
            title: "ebpf-cni benchmark".to_owned(),
            date: "2026-11-02".to_owned(),
            commit: "abc1234".to_owned(),
            machine: "2 cores, 24 GiB".to_owned(),
            kernel: "6.12.0".to_owned(),
            command: "cargo xtask bench --runs 5".to_owned(),
            notes: vec!["pods in network namespaces on one node".to_owned()],
            figures: vec![
                figure(
                    "pod-to-pod TCP throughput",
                    "Gbit/s",
                    true,
                    [stats(13.4), stats(10.0), stats(20.0)],
                ),
                figure(
                    "pod ADD latency",
                    "ms",
                    false,
                    [stats(50.0), stats(100.0), Value::NotApplicable],
                ),
                figure(
                    "service to pod with source NAT",
                    "ops/s",
                    true,
                    [
                        Value::Missing("source NAT not built yet".to_owned()),
                        stats(25_000.0),
                        stats(40_000.0),
                    ],
                ),
            ],
        }
    }

    #[test]
    fn median_of_odd_count_is_the_middle_sample() {
        let s = Stats::from_samples(&[3.0, 1.0, 2.0]).expect("three samples give stats");
        assert_eq!(
            s,
            Stats {
                median: 2.0,
                min: 1.0,
                max: 3.0,
                runs: 3
            }
        );
    }

    #[test]
    fn median_of_even_count_is_the_mean_of_the_two_middle_samples() {
        let s = Stats::from_samples(&[4.0, 1.0, 3.0, 2.0]).expect("four samples give stats");
        assert_eq!(
            s,
            Stats {
                median: 2.5,
                min: 1.0,
                max: 4.0,
                runs: 4
            }
        );
    }

    #[test]
    fn no_samples_give_no_stats() {
        assert_eq!(Stats::from_samples(&[]), None);
        assert_eq!(Stats::from_samples(&[f64::NAN, f64::NAN]), None);
    }

    #[test]
    fn nan_samples_are_ignored() {
        let s = Stats::from_samples(&[f64::NAN, 5.0, 1.0, f64::NAN]).expect("two real samples");
        assert_eq!(
            s,
            Stats {
                median: 3.0,
                min: 1.0,
                max: 5.0,
                runs: 2
            }
        );
    }

    #[test]
    fn ratio_divides_medians_when_higher_is_better() {
        let report = sample();
        let r = ratio(&report.figures[0], Contender::EbpfCni, Contender::Reference);
        assert!((r.expect("both measured") - 1.34).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn ratio_inverts_when_lower_is_better() {
        let report = sample();
        let r = ratio(&report.figures[1], Contender::EbpfCni, Contender::Reference);
        assert_eq!(r, Some(2.0), "half the latency is twice as good");
    }

    #[test]
    fn ratio_needs_both_sides_measured_and_non_zero() {
        let report = sample();
        let [_, latency, nat] = &report.figures[..] else {
            panic!("the sample has three figures");
        };
        assert_eq!(ratio(nat, Contender::EbpfCni, Contender::Reference), None);
        assert_eq!(ratio(latency, Contender::EbpfCni, Contender::Raw), None);
        let zero = figure("zero", "ms", false, [stats(0.0), stats(1.0), stats(1.0)]);
        assert_eq!(ratio(&zero, Contender::EbpfCni, Contender::Reference), None);
        assert_eq!(ratio(&zero, Contender::Reference, Contender::EbpfCni), None);
    }

    #[test]
    fn numbers_keep_three_significant_digits_and_large_ones_are_whole() {
        let cases = [
            (9.412, "9.41"),
            (0.012345, "0.0123"),
            (9.996, "10.0"),
            (42.25, "42.2"),
            (123.4, "123"),
            (25_432.7, "25433"),
            (0.0, "0"),
        ];
        for (value, text) in cases {
            assert_eq!(number(value), text, "formatting {value}");
        }
    }

    #[test]
    fn a_single_run_shows_no_spread() {
        let one = Stats::from_samples(&[30.0]).expect("one sample");
        let figure = figure(
            "memory",
            "MiB",
            false,
            [Value::Measured(one), stats(1.0), stats(1.0)],
        );
        assert_eq!(value_text(&figure, Contender::EbpfCni), "30.0 (1 run)");
    }

    #[test]
    fn markdown_has_the_table_the_ratios_and_the_chart_link() {
        let md = render_markdown(&sample(), "bench.svg");
        for expected in [
            "| figure | unit | ebpf-cni | reference | raw veth | ebpf-cni vs reference | ebpf-cni vs raw |",
            "```sh\ncargo xtask bench --runs 5\n```",
            "- pods in network namespaces on one node",
            "| pod-to-pod TCP throughput | Gbit/s | 13.4 (12.1–14.7) | 10.0 (9.00–11.0) | 20.0 (18.0–22.0) | 1.34x | 0.67x |",
            "| pod ADD latency | ms | 50.0 (45.0–55.0) | 100 (90.0–110) | n/a | 2.00x | — |",
            "| missing: source NAT not built yet | 25000 (22500–27500) | 40000 (36000–44000) | — | — |",
            "above 1.00x means ebpf-cni is better",
            "](bench.svg)",
        ] {
            assert!(md.contains(expected), "missing {expected:?} in:\n{md}");
        }
    }

    #[test]
    fn svg_shows_every_figure_with_a_ratio_and_its_labels() {
        let svg = render_svg(&sample()).expect("the sample renders");
        assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        for expected in [
            "pod-to-pod TCP throughput",
            "pod ADD latency",
            "1.34x",
            "0.67x",
            "2.00x",
            "ebpf-cni vs raw veth (ceiling)",
            "ratio (&gt; 1 = ebpf-cni better)",
        ] {
            assert!(svg.contains(expected), "missing {expected:?} in:\n{svg}");
        }
        // No ratio can be drawn for a figure ebpf-cni did not measure.
        assert!(!svg.contains("source NAT"), "{svg}");
    }

    #[test]
    fn svg_without_any_ratio_says_so() {
        let mut report = sample();
        report.figures.truncate(0);
        let svg = render_svg(&report).expect("an empty report renders");
        assert!(
            svg.starts_with("<svg") && svg.contains("no ratios measured yet"),
            "{svg}"
        );
    }

    #[test]
    fn write_links_the_chart_beside_or_below_the_page() {
        let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
        let cases = [
            (
                dir.join("quick/BENCHMARKS.md"),
                dir.join("quick/benchmarks.svg"),
                "](benchmarks.svg)",
            ),
            (
                dir.join("BENCHMARKS.md"),
                dir.join("docs/benchmarks.svg"),
                "](docs/benchmarks.svg)",
            ),
            (
                dir.join("a/BENCHMARKS.md"),
                dir.join("b/benchmarks.svg"),
                "](benchmarks.svg)",
            ),
        ];
        for (md_path, svg_path, link) in cases {
            write(&sample(), &md_path, &svg_path).expect("writing the report");
            let md = fs::read_to_string(&md_path).expect("markdown written");
            let svg = fs::read_to_string(&svg_path).expect("svg written");
            assert!(md.contains(link), "no {link:?} in:\n{md}");
            assert!(svg.contains("1.34x"), "{svg}");
        }
        fs::remove_dir_all(&dir).expect("cleaning up");
    }
}
