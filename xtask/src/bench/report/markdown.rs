//! The report as a Markdown page: a header with what reproduces the run, one table with
//! median (min–max) per contender and the ratios, and the link to the chart.

use std::fmt::Write as _;

use super::{Contender, Figure, RATIOS, Report, Value, ratio};

/// The Markdown page; `chart_file_name` is linked as is, so it is a path from the page's
/// folder (see [`write`](super::write)).
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

pub(super) fn value_text(figure: &Figure, contender: Contender) -> String {
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
pub(super) fn number(value: f64) -> String {
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
