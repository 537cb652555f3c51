//! The report's model, its Markdown and its SVG, checked on a fixed sample report.

use super::{
    markdown::{number, value_text},
    *,
};

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
