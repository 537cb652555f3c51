//! The daemon's health and metrics endpoints as a probe or Prometheus reads them: HTTP
//! GETs from inside the node's namespace (where the daemon listens, on
//! `127.0.0.1:9876` unless told otherwise), and samples picked out of the Prometheus
//! text format.

use std::time::Duration;

use crate::netns::Netns;

/// The daemon's default `--metrics-address`, inside its namespace.
pub const METRICS_ADDRESS: &str = "127.0.0.1:9876";

/// The daemon's default `--health-address` (the probes'), inside its namespace.
pub const HEALTH_ADDRESS: &str = "127.0.0.1:9877";

/// An answer: status code and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// `GET http://<address><path>` from inside `netns`, within `timeout`; `Err` when no
/// answer came (refused, timed out).
pub fn get_at(
    netns: &Netns,
    address: &str,
    path: &str,
    timeout: Duration,
) -> Result<Answer, String> {
    let url = format!("http://{address}{path}");
    crate::traffic::run_in(netns, move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .proxy(None)
            .build()
            .into();
        let mut response = agent.get(&url).call().map_err(|error| error.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .read_to_string()
            .map_err(|error| error.to_string())?;
        Ok(Answer { status, body })
    })
}

/// [`get_at`] on the default address with a 5 s timeout; panics when nothing answers.
pub fn get(netns: &Netns, path: &str) -> Answer {
    get_at(netns, METRICS_ADDRESS, path, Duration::from_secs(5))
        .unwrap_or_else(|error| panic!("GET {path} got no answer: {error}"))
}

/// `/metrics`, checked to be a 200.
pub fn scrape(netns: &Netns) -> Metrics {
    let answer = get(netns, "/metrics");
    assert_eq!(answer.status, 200, "GET /metrics: {answer:?}");
    Metrics(answer.body)
}

/// A scrape in the Prometheus text format.
#[derive(Debug, Clone)]
pub struct Metrics(pub String);

impl Metrics {
    /// Every sample of `name` (as the text names it: `_total`, `_count`, `_sum`
    /// included; histogram buckets are not samples here), with its labels, as
    /// `prometheus-parse` reads the text.
    pub fn samples(&self, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
        let scrape =
            prometheus_parse::Scrape::parse(self.0.lines().map(|line| Ok(line.to_owned())))
                .unwrap_or_else(|error| panic!("not the Prometheus text format: {error}"));
        scrape
            .samples
            .into_iter()
            .filter(|sample| sample.metric == name)
            .filter_map(|sample| {
                let value = match sample.value {
                    prometheus_parse::Value::Counter(value)
                    | prometheus_parse::Value::Gauge(value)
                    | prometheus_parse::Value::Untyped(value) => value,
                    _ => return None,
                };
                let labels = sample
                    .labels
                    .iter()
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect();
                Some((labels, value))
            })
            .collect()
    }

    /// The value of the sample of `name` whose labels include `labels`; `None` when
    /// there is none; panics when several match.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples(name)
            .into_iter()
            .filter(|(have, _)| {
                labels
                    .iter()
                    .all(|(key, value)| have.iter().any(|(k, v)| k == key && v == value))
            })
            .map(|(_, value)| value)
            .collect();
        assert!(
            matching.len() <= 1,
            "several samples of {name} match {labels:?}:\n{}",
            self.0
        );
        matching.first().copied()
    }

    /// Like [`Self::value`], panicking when there is none.
    pub fn expect(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in:\n{}", self.0))
    }
}
