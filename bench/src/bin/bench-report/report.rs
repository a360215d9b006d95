//! What the report is made of: the runs, their medians and ratios, the verdicts, and the CPU targets.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use time::OffsetDateTime;

pub(crate) const MODES: [&str; 4] = ["c1", "c8", "c64", "open1000"];
pub(crate) const CASES: [&str; 8] = [
    "mix",
    "inject",
    "inject_2k",
    "inject_80k",
    "opted_out",
    "already_injected",
    "bare",
    "update",
];

/// Targets (BENCHMARKS.md): core path, CPU ratios, open-loop p99, flood RSS and deadline, offline.
pub(crate) const CORE_PATH_US: f64 = 30.0;
/// The core path of a Pod left alone: opted out, already wired, no opt-in.
pub(crate) const CORE_SKIP_US: f64 = 15.0;
pub(crate) const RATIO_INJECT: f64 = 2.5;
pub(crate) const RATIO_SKIP: f64 = 1.5;
pub(crate) const P99_US: f64 = 1000.0;
pub(crate) const FLOOD_RSS_MIB: f64 = 32.0;
pub(crate) const APISERVER_TIMEOUT_US: f64 = 10e6;
pub(crate) const OFFLINE_S: f64 = 2.0;
/// The server's CPU per extra KiB of an injected Pod, against the floor's (which reads the same bytes).
pub(crate) const PER_KIB_RATIO: f64 = 2.0;

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// A run's label: KIND/CASE/MODE/ROUND.
pub(crate) struct Run {
    pub(crate) kind: String,
    pub(crate) case: String,
    pub(crate) mode: String,
    pub(crate) round: String,
    pub(crate) v: Value,
}

/// Other work on the machine (cores) above which a run counts as disturbed.
pub(crate) const NOISY_CORES: f64 = 0.25;

pub(crate) fn clean(r: &Run) -> bool {
    f(&r.v, "/foreign_cpu").is_none_or(|x| x <= NOISY_CORES)
}

pub(crate) fn f(v: &Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer).and_then(Value::as_f64)
}

pub(crate) fn fmt(x: Option<f64>, decimals: usize) -> String {
    x.map_or("-".into(), |x| format!("{x:.decimals$}"))
}

pub(crate) struct Report {
    pub(crate) runs: Vec<Run>,
    pub(crate) text: String,
    pub(crate) verdicts: Vec<Value>,
    pub(crate) summary: BTreeMap<String, Value>,
}

impl Report {
    pub(crate) fn select<'a>(
        &'a self,
        kind: &'a str,
        case: &'a str,
        mode: &'a str,
    ) -> impl Iterator<Item = &'a Run> + 'a {
        self.runs
            .iter()
            .filter(move |r| r.kind == kind && r.case == case && r.mode == mode)
    }

    /// The runs of a kind, case and mode that had the machine to themselves (other work under 0.25 cores),
    /// or all of them when none did.
    pub(crate) fn select_clean<'a>(
        &'a self,
        kind: &'a str,
        case: &'a str,
        mode: &'a str,
    ) -> Vec<&'a Run> {
        let all: Vec<&Run> = self.select(kind, case, mode).collect();
        let clean: Vec<&Run> = all.iter().copied().filter(|r| clean(r)).collect();
        if clean.is_empty() { all } else { clean }
    }

    pub(crate) fn med(&self, kind: &str, case: &str, mode: &str, pointer: &str) -> Option<f64> {
        median(
            self.select_clean(kind, case, mode)
                .iter()
                .filter_map(|r| f(&r.v, pointer))
                .collect(),
        )
    }

    pub(crate) fn max(&self, kind: &str, case: &str, pointer: &str) -> Option<f64> {
        self.runs
            .iter()
            .filter(|r| r.kind == kind && r.case == case)
            .filter_map(|r| f(&r.v, pointer))
            .reduce(f64::max)
    }

    /// Median over rounds of ours/floor CPU per request.
    pub(crate) fn ratio(&self, case: &str, mode: &str) -> Option<f64> {
        median(self.ratios(case, mode))
    }

    /// ours/floor CPU per request of each round, each server run paired with the floor run of its round.
    /// (Pairs where both runs were undisturbed, when there are any.)
    pub(crate) fn ratios(&self, case: &str, mode: &str) -> Vec<f64> {
        let pairs: Vec<(&Run, &Run)> = self
            .select("ours", case, mode)
            .filter_map(|ours| {
                let floor = self
                    .select("floor", case, mode)
                    .find(|fl| fl.round == ours.round)?;
                Some((ours, floor))
            })
            .collect();
        let clean_pairs: Vec<(&Run, &Run)> = pairs
            .iter()
            .copied()
            .filter(|(o, fl)| clean(o) && clean(fl))
            .collect();
        let used = if clean_pairs.is_empty() {
            pairs
        } else {
            clean_pairs
        };
        used.iter()
            .filter_map(|(o, fl)| {
                Some(f(&o.v, "/server/cpu_us_per_req")? / f(&fl.v, "/server/cpu_us_per_req")?)
            })
            .collect()
    }

    pub(crate) fn line(&mut self, s: impl AsRef<str>) {
        self.text.push_str(s.as_ref());
        self.text.push('\n');
    }

    pub(crate) fn verdict(
        &mut self,
        target: &str,
        measured: String,
        pass: Option<bool>,
        note: &str,
    ) {
        let word = match pass {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "n/a",
        };
        let line = format!("  {word:<5} {target}: {measured}");
        self.line(line);
        if !note.trim().is_empty() {
            self.line(format!("        {}", note.trim()));
        }
        self.verdicts
            .push(json!({"target": target, "measured": measured, "pass": pass}));
    }
}

/// criterion's median per class and size, in microseconds, and whether it was measured at or after `since` (the
/// run's start).
pub(crate) fn criterion_estimates(
    dir: &Path,
    since: Option<OffsetDateTime>,
) -> BTreeMap<(String, String), (f64, bool)> {
    let mut out = BTreeMap::new();
    for class in ["Inject", "OptedOut", "AlreadyInjected", "Bare", "Update"] {
        for size in ["2KiB", "22KiB", "80KiB"] {
            let path = dir
                .join("review")
                .join(class)
                .join(size)
                .join("new/estimates.json");
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let fresh = since.is_none_or(|since| {
                std::fs::metadata(&path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| OffsetDateTime::from(t) >= since)
            });
            if let Some(ns) = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| f(&v, "/median/point_estimate"))
            {
                out.insert((class.to_string(), size.to_string()), (ns / 1000.0, fresh));
            }
        }
    }
    out
}

/// The CPU targets: each case's ours/floor ratio at c8, and what each extra KiB of an injected Pod costs.
pub(crate) fn cpu_targets(report: &mut Report, cases: &[&str]) {
    for case in cases {
        let (limit, what) = match *case {
            "inject" => (RATIO_INJECT, "Pods injected"),
            "inject_2k" => (RATIO_INJECT, "Pods injected, 2 KiB"),
            "inject_80k" => (RATIO_INJECT, "Pods injected, 80 KiB"),
            "mix" => continue,
            "update" => (RATIO_SKIP, "other kinds (UPDATE)"),
            _ => (RATIO_SKIP, "Pods skipped"),
        };
        let r8 = report.ratio(case, "c8");
        let others: Vec<String> = ["c1", "c64", "open1000"]
            .iter()
            .map(|m| format!("{m} {}", fmt(report.ratio(case, m), 2)))
            .collect();
        report.verdict(
            &format!("CPU/req ours/floor at c8, {case} ({what}) <= {limit}x"),
            format!("{}x", fmt(r8, 2)),
            r8.map(|r| r <= limit),
            &format!(
                "ours {} us vs floor {} us per request; rounds {}; other load points: {}",
                fmt(report.med("ours", case, "c8", "/server/cpu_us_per_req"), 1),
                fmt(report.med("floor", case, "c8", "/server/cpu_us_per_req"), 1),
                report
                    .ratios(case, "c8")
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                others.join(", ")
            ),
        );
        // The measure of the runs before 2026-12-05, beside it: the client's wake-ups charged to the server.
        let sleeping = report.ratio(case, "c8sleep");
        if sleeping.is_some() {
            report.line(format!(
                "        {case} at c8 with a client that sleeps between answers: ours {} us vs floor {} us, {}x",
                fmt(report.med("ours", case, "c8sleep", "/server/cpu_us_per_req"), 1),
                fmt(report.med("floor", case, "c8sleep", "/server/cpu_us_per_req"), 1),
                fmt(sleeping, 2)
            ));
        }
    }
    // What each extra KiB of an injected Pod costs at c8, ours against the floor's, between 2 and 22 KiB and
    // between 22 and 80 KiB: the fixed cost of a request apart.
    for (small, large, kib) in [
        ("inject_2k", "inject", 20.0),
        ("inject", "inject_80k", 58.0),
    ] {
        let cpu = |kind: &str, case: &str| report.med(kind, case, "c8", "/server/cpu_us_per_req");
        let per_kib = |kind: &str| Some((cpu(kind, large)? - cpu(kind, small)?) / kib);
        let (ours, floor) = (per_kib("ours"), per_kib("floor"));
        let ratio = ours.zip(floor).map(|(o, f)| o / f);
        report.verdict(
            &format!("CPU per extra KiB at c8, {small} -> {large}, ours/floor <= {PER_KIB_RATIO}x"),
            format!("{}x", fmt(ratio, 2)),
            ratio.map(|r| r <= PER_KIB_RATIO),
            &format!(
                "ours {} us vs floor {} us per KiB",
                fmt(ours, 2),
                fmt(floor, 2)
            ),
        );
    }
}
