//! Percentiles and the result rows (table + JSON).
use serde::Serialize;

/// Nearest-rank percentile of `v` (`p` in 0..=100); 0 for no samples.
pub fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// One figure: samples against a baseline and a goal.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub metric: String,
    pub unit: &'static str,
    pub samples: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub baseline_p50: Option<f64>,
    pub baseline_p99: Option<f64>,
    /// p99 / baseline p99 (or the figure's own ratio, e.g. throughput off/on).
    pub ratio: Option<f64>,
    pub goal: String,
    /// Whether the goal is met (`met` in the JSON); `None`: nothing to judge (placeholder).
    #[serde(rename = "met")]
    pub pass: Option<bool>,
    pub note: String,
}

impl Row {
    /// A latency row from samples and baseline samples (both in the row's unit).
    pub fn latency(metric: String, unit: &'static str, s: &[f64], b: Option<&[f64]>) -> Self {
        let p99 = pct(s, 99.0);
        let bp99 = b.map(|b| pct(b, 99.0));
        Self {
            metric,
            unit,
            samples: s.len(),
            p50: Some(pct(s, 50.0)),
            p99: Some(p99),
            baseline_p50: b.map(|b| pct(b, 50.0)),
            baseline_p99: bp99,
            ratio: bp99.filter(|b| *b > 0.0).map(|b| p99 / b),
            goal: String::new(),
            pass: None,
            note: String::new(),
        }
    }

    pub fn goal(mut self, goal: impl Into<String>, pass: bool) -> Self {
        self.goal = goal.into();
        self.pass = Some(pass);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

fn num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
    }
}

/// The table printed on stdout.
pub fn table(rows: &[Row]) -> String {
    let head = [
        "metric", "unit", "n", "p50", "p99", "base p50", "base p99", "ratio", "goal", "result",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.metric.clone(),
                r.unit.to_owned(),
                r.samples.to_string(),
                num(r.p50),
                num(r.p99),
                num(r.baseline_p50),
                num(r.baseline_p99),
                r.ratio.map_or_else(|| "-".into(), |x| format!("{x:.2}")),
                r.goal.clone(),
                match r.pass {
                    Some(true) => "ok".into(),
                    Some(false) => "MISSED".into(),
                    None => r.note.clone(),
                },
            ]
        })
        .collect();
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for c in &cells {
        for (i, x) in c.iter().enumerate() {
            w[i] = w[i].max(x.chars().count());
        }
    }
    let line = |c: &[String]| {
        let mut s = String::new();
        for (i, x) in c.iter().enumerate() {
            let pad = w[i].saturating_sub(x.chars().count());
            if i == 0 || i == 1 || i >= 8 {
                s.push_str(x);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(x);
            }
            s.push_str("  ");
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&head.map(str::to_owned));
    out.push_str(&line(&w.iter().map(|n| "-".repeat(*n)).collect::<Vec<_>>()));
    for c in &cells {
        out.push_str(&line(c));
    }
    let notes: Vec<&Row> = rows
        .iter()
        .filter(|r| r.pass.is_some() && !r.note.is_empty())
        .collect();
    if !notes.is_empty() {
        out.push('\n');
        for r in notes {
            out.push_str(&format!("{}: {}\n", r.metric, r.note));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((pct(&v, 50.0) - 50.0).abs() < f64::EPSILON);
        assert!((pct(&v, 99.0) - 99.0).abs() < f64::EPSILON);
        assert!((pct(&[3.0, 1.0, 2.0], 99.0) - 3.0).abs() < f64::EPSILON);
        assert!(pct(&[], 50.0).abs() < f64::EPSILON);
    }
}
