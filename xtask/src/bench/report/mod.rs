//! The benchmark report: the data model every bench figure is recorded in, and its two
//! renderings, a Markdown page with one table and an SVG chart of the ratios it links to.
//! Nothing here measures or estimates: a figure that was not measured shows why, and
//! never takes part in a ratio.

mod markdown;
mod svg;
#[cfg(test)]
mod tests;

use std::{fs, io, path::Path};

pub use markdown::render_markdown;
pub use svg::render_svg;

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
            Contender::Raw => {
                "raw veth (ceiling: pod to pod, one veth pair; pod to external, two veth \
                 pairs through a namespace that routes, without NAT; across nodes, the two \
                 nodes themselves, directly or, for the overlay, over kernel VXLAN devices)"
            }
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
