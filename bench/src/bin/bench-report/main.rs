//! The report of `scripts/bench.sh`: reads target/bench/results.jsonl (one JSON object per load run, plus meta,
//! offline and oha lines) and criterion's estimates, prints the tables, the ratios ours/floor and pass/miss per
//! target, and writes the medians and verdicts as JSON.
//!
//! ```text
//! bench-report target/bench/results.jsonl [--criterion target/criterion] [--summary FILE] [--strict]
//! ```
//! Medians are over rounds. The CPU ratio of a case is the median over rounds of ours/floor, each round's floor
//! measured just before the server on the same bodies.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Parser;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The flags; `--help` prints them.
#[derive(Parser)]
#[command(
    name = "bench-report",
    about = "The report of scripts/bench.sh: tables, ratios ours/floor and pass/miss per target"
)]
struct Args {
    /// The runs' results, one JSON object a line (target/bench/results.jsonl).
    results: PathBuf,
    /// criterion's output directory, for the core path's estimates.
    #[arg(
        long = "criterion",
        value_name = "DIR",
        default_value = "target/criterion"
    )]
    criterion_dir: PathBuf,
    /// Also write the medians and verdicts here, as JSON.
    #[arg(long = "summary", value_name = "FILE")]
    summary_path: Option<PathBuf>,
    /// Exit 1 when a target is missed.
    #[arg(long)]
    strict: bool,
}

mod report;

use report::{
    APISERVER_TIMEOUT_US, CASES, CORE_PATH_US, CORE_SKIP_US, FLOOD_RSS_MIB, MODES, OFFLINE_S,
    P99_US, Report, Run, clean, cpu_targets, criterion_estimates, f, fmt, median,
};

fn main() {
    let Args {
        results,
        criterion_dir,
        summary_path,
        strict,
    } = Args::parse();
    let text = std::fs::read_to_string(&results).unwrap_or_else(|e| {
        eprintln!("bench-report: cannot read {}: {e}", results.display());
        std::process::exit(2);
    });
    let mut report = Report {
        runs: vec![],
        text: String::new(),
        verdicts: vec![],
        summary: BTreeMap::new(),
    };
    let mut meta = Value::Null;
    let mut meta_end = Value::Null;
    // Offline runs by the CPUs they ran on (results before the field ran on one).
    let mut offline: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    let mut offline_summary = String::new();
    let mut oha = vec![];
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            eprintln!("bench-report: skipping a line that is not JSON: {line:.80}");
            continue;
        };
        match v["kind"].as_str() {
            Some("meta") => meta = v,
            Some("meta_end") => meta_end = v,
            Some("offline") => {
                let cpus = v["cpus"].as_u64().unwrap_or(1);
                offline.entry(cpus).or_default().extend(f(&v, "/seconds"));
                offline_summary = v["summary"].as_str().unwrap_or("").to_string();
            }
            Some("oha") => oha.push(v),
            _ => {
                let label = v["label"].as_str().unwrap_or("").to_string();
                let parts: Vec<&str> = label.split('/').collect();
                if let [kind, case, mode, round] = parts[..] {
                    report.runs.push(Run {
                        kind: kind.into(),
                        case: case.into(),
                        mode: mode.into(),
                        round: round.into(),
                        v,
                    });
                }
            }
        }
    }
    let started = meta["date"]
        .as_str()
        .and_then(|d| OffsetDateTime::parse(d, &Rfc3339).ok());
    let cases: Vec<&str> = CASES
        .iter()
        .copied()
        .filter(|c| report.runs.iter().any(|r| r.case == *c))
        .collect();

    // --- header -------------------------------------------------------------------------------------------------
    report.line(format!(
        "pdp-injector {} benchmarks, {}  ({}; {} cores; kernel {}; {}{} round(s); load before {}, after {}; {} s)",
        meta["commit"].as_str().unwrap_or("?"),
        meta["date"].as_str().unwrap_or("?"),
        meta["cpu"].as_str().unwrap_or("?"),
        meta["cores"],
        meta["kernel"].as_str().unwrap_or("?"),
        if meta["quick"] == json!(true) {
            "QUICK smoke run, "
        } else {
            ""
        },
        meta["rounds"],
        meta["load_before"].as_str().unwrap_or("?"),
        meta_end["load_after"].as_str().unwrap_or("?"),
        meta_end["elapsed_s"],
    ));
    report.line(
        "server pinned to core 0, load generator (bench/src/bin/loadgen.rs, 1 thread, --spin: never sleeps) to core 1",
    );
    report.line(
        "figures are medians over rounds, leaving out runs disturbed by other work (> 0.25 cores) when an undisturbed one exists",
    );
    let foreign: Vec<f64> = report
        .runs
        .iter()
        .filter_map(|r| f(&r.v, "/foreign_cpu"))
        .collect();
    let noisy: Vec<String> = report
        .runs
        .iter()
        .filter(|r| !clean(r))
        .map(|r| {
            format!(
                "{}/{}/{}/{} ({:.2})",
                r.kind,
                r.case,
                r.mode,
                r.round,
                f(&r.v, "/foreign_cpu").unwrap_or(0.0)
            )
        })
        .collect();
    report.line(format!(
        "other work on the machine during the runs (cores, from /proc/stat): median {}, max {}; waited {} s for quiet",
        fmt(median(foreign.clone()), 2),
        fmt(foreign.iter().copied().reduce(f64::max), 2),
        meta_end["waited_s"],
    ));
    if !noisy.is_empty() {
        report.line(format!(
            "  disturbed runs (cores of other work): {}",
            noisy.join(", ")
        ));
    }
    report.line("");

    // --- problems -------------------------------------------------------------------------------------------------
    let mut problems = vec![];
    for r in &report.runs {
        let errors = r.v["errors"].as_u64().unwrap_or(0);
        let non_200: u64 = r.v["status"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| *k != "200")
                    .filter_map(|(_, v)| v.as_u64())
                    .sum()
            })
            .unwrap_or(0);
        let alive = r.v["server"]["alive"].as_bool().unwrap_or(true);
        if r.case != "flood" && (errors > 0 || non_200 > 0) || !alive || r.v["requests"] == 0 {
            problems.push(format!(
                "{}/{}/{}/{}: {} errors {}, statuses {}, server alive {}",
                r.kind, r.case, r.mode, r.round, errors, r.v["error_samples"], r.v["status"], alive
            ));
        }
    }

    // --- closed loop throughput ---------------------------------------------------------------------------------
    report.line(
        "Requests/s, closed loop, keep-alive (floor = null handler on the same stack and bodies)",
    );
    report.line(format!(
        "  {:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "case", "floor c1", "ours c1", "floor c8", "ours c8", "floor c64", "ours c64"
    ));
    for case in &cases {
        let mut row = format!("  {case:<18}");
        for mode in ["c1", "c8", "c64"] {
            for kind in ["floor", "ours"] {
                let _ = write!(row, " {:>9}", fmt(report.med(kind, case, mode, "/rps"), 0));
            }
        }
        report.line(row);
    }
    report.line("");

    // --- open loop latency --------------------------------------------------------------------------------------
    report.line(format!(
        "Latency at {} req/s open loop on 8 connections, first second left out (microseconds)",
        1000
    ));
    report.line(format!(
        "  {:<18} {:>7} {:>7} {:>7} {:>7}   {:>7} {:>7} {:>7} {:>7}",
        "case", "floor50", "p99", "p99.9", "max", "ours50", "p99", "p99.9", "max"
    ));
    for case in &cases {
        let mut row = format!("  {case:<18}");
        for kind in ["floor", "ours"] {
            for p in ["p50", "p99", "p999", "max"] {
                let _ = write!(
                    row,
                    " {:>7}",
                    fmt(
                        report.med(kind, case, "open1000", &format!("/latency_us/{p}")),
                        0
                    )
                );
            }
            row.push_str("  ");
        }
        report.line(row);
    }
    report.line("");

    // --- CPU per request ------------------------------------------------------------------------------------------
    report.line("Server CPU per request (utime+stime over the window / requests, microseconds) and ours/floor");
    report.line(format!(
        "  {:<18} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  {:>6} {:>6} {:>6} {:>6}",
        "case",
        "floor c1",
        "ours c1",
        "floor c8",
        "ours c8",
        "fl c64",
        "ours c64",
        "fl open",
        "ours op",
        "x c1",
        "x c8",
        "x c64",
        "x open"
    ));
    for case in &cases {
        let mut row = format!("  {case:<18}");
        for mode in MODES {
            for kind in ["floor", "ours"] {
                let _ = write!(
                    row,
                    " {:>8}",
                    fmt(report.med(kind, case, mode, "/server/cpu_us_per_req"), 1)
                );
            }
        }
        row.push(' ');
        for mode in MODES {
            let _ = write!(row, " {:>6}", fmt(report.ratio(case, mode), 2));
        }
        report.line(row);
    }
    report.line("");

    // --- RSS --------------------------------------------------------------------------------------------------------
    report.line("Peak RSS (VmHWM of a fresh process per case, MiB; highest over rounds)");
    let mut row = format!("  {:<18}", "");
    for case in &cases {
        let _ = write!(row, " {case:>16}");
    }
    report.line(row);
    for kind in ["floor", "ours"] {
        let mut row = format!("  {kind:<18}");
        for case in &cases {
            let _ = write!(
                row,
                " {:>16}",
                fmt(
                    report
                        .max(kind, case, "/server/vmhwm_kib")
                        .map(|k| k / 1024.0),
                    1
                )
            );
        }
        report.line(row);
    }
    report.line("");

    // --- flood ------------------------------------------------------------------------------------------------------
    let flood = report
        .runs
        .iter()
        .find(|r| r.case == "flood" && r.kind == "ours")
        .map(|r| r.v.clone());
    let floor_flood = report
        .runs
        .iter()
        .find(|r| r.case == "flood" && r.kind == "floor")
        .map(|r| r.v.clone());
    if let Some(fl) = &flood {
        let total = fl["requests"].as_f64().unwrap_or(0.0);
        let count = |s: &str| f(fl, &format!("/status/{s}")).unwrap_or(0.0);
        let share_503 = if total > 0.0 {
            count("503") / total
        } else {
            0.0
        };
        report.line(
            "Flood: 512 connections posting 80 KiB reviews, closed loop, serve --max-in-flight 256",
        );
        let closed = count("0");
        report.line(format!(
            "  {} requests/s ended: {} x 200, {} x 503 ({:.1}%), {} closed by the server before an answer ({:.1}%), \
             others {}; connections opened {}",
            fl["rps"],
            count("200"),
            count("503"),
            share_503 * 100.0,
            closed,
            if total > 0.0 { closed / total * 100.0 } else { 0.0 },
            total - count("200") - count("503") - closed,
            fl["connects"],
        ));
        for (s, what) in [("200", "200"), ("503", "503"), ("0", "closed")] {
            if let Some(b) = fl["by_status"].get(s) {
                report.line(format!(
                    "  {what:>6}: p50 {} us, p99 {} us, p99.9 {} us, max {} us",
                    b["p50"], b["p99"], b["p999"], b["max"]
                ));
            }
        }
        if closed > 0.0 {
            report.line(format!("  closed: {}", fl["error_samples"]));
        }
        report.line(format!(
            "  server: peak RSS {} MiB, CPU {}% of a core; load generator {}% of a core",
            fmt(f(fl, "/server/vmhwm_kib").map(|k| k / 1024.0), 1),
            fmt(f(fl, "/server/cpu_share").map(|c| c * 100.0), 0),
            fmt(f(fl, "/loadgen_cpu_share").map(|c| c * 100.0), 0),
        ));
        if let Some(fl0) = &floor_flood {
            report.line(format!(
                "  the null handler under the same flood: peak RSS {} MiB, {} req/s, max latency {} us, {} closed",
                fmt(f(fl0, "/server/vmhwm_kib").map(|k| k / 1024.0), 1),
                fl0["rps"],
                fl0["latency_us"]["max"],
                f(fl0, "/status/0").unwrap_or(0.0),
            ));
        }
        report.line("");
    }

    // --- offline ----------------------------------------------------------------------------------------------------
    // The verdict is the run on every CPU (the most of them), the one-CPU run printed beside it.
    let offline_all = offline.last_key_value().map(|(c, r)| (*c, r.clone()));
    let offline_one = offline.get(&1).cloned().unwrap_or_default();
    let offline_median = offline_all.as_ref().and_then(|(_, r)| median(r.clone()));
    for (cpus, runs) in &offline {
        report.line(format!(
            "Offline: pdp-injector inject -f of 20,000 documents on {cpus} CPU{}: median {} s over {runs:?} ({offline_summary})",
            if *cpus == 1 { "" } else { "s" },
            fmt(median(runs.clone()), 2),
        ));
    }
    if !offline.is_empty() {
        report.line("");
    }
    if !oha.is_empty() {
        let mut row = String::from("Cross-check at 8 connections, 22 KiB inject body (req/s): ");
        for o in &oha {
            let kind = o["server"].as_str().unwrap_or("?");
            let ours = report
                .runs
                .iter()
                .find(|r| r.kind == kind && r.case == "xcheck")
                .and_then(|r| f(&r.v, "/rps"));
            let _ = write!(
                row,
                "{kind}: oha {} vs loadgen {};  ",
                fmt(f(o, "/rps"), 0),
                fmt(ours, 0)
            );
        }
        report.line(row);
        report.line("");
    }

    // --- criterion ---------------------------------------------------------------------------------------------------
    let est = criterion_estimates(&criterion_dir, started);
    if !est.is_empty() {
        report.line("Core path (criterion, cargo bench --bench core: decode, decide, render, diff, encode), median us");
        report.line(format!(
            "  {:<18} {:>8} {:>8} {:>8}",
            "class", "2KiB", "22KiB", "80KiB"
        ));
        for class in ["Inject", "OptedOut", "AlreadyInjected", "Bare", "Update"] {
            let mut row = format!("  {class:<18}");
            for size in ["2KiB", "22KiB", "80KiB"] {
                let cell = est
                    .get(&(class.to_string(), size.to_string()))
                    .map_or("-".to_string(), |(us, fresh)| {
                        format!("{us:.1}{}", if *fresh { "" } else { "*" })
                    });
                let _ = write!(row, " {cell:>8}");
            }
            report.line(row);
        }
        if est.values().any(|(_, fresh)| !fresh) {
            report.line("  * from an earlier criterion run (not refreshed by this one)");
        }
        report.line("");
    }

    // --- targets -----------------------------------------------------------------------------------------------------
    report.line("Targets (2 cores, server on one core, 22 KiB Pod, keep-alive)");
    let core = est
        .get(&("Inject".to_string(), "22KiB".to_string()))
        .copied();
    let stale = |c: Option<(f64, bool)>| {
        if c.is_some_and(|c| !c.1) {
            " (stale: not measured by this run)"
        } else {
            ""
        }
    };
    report.verdict(
        "core path (criterion review/Inject/22KiB) <= 30 us",
        fmt(core.map(|c| c.0), 1) + " us",
        core.map(|c| c.0 <= CORE_PATH_US),
        stale(core),
    );
    for class in ["OptedOut", "AlreadyInjected", "Bare"] {
        let skip = est.get(&(class.to_string(), "22KiB".to_string())).copied();
        report.verdict(
            &format!("core path of a skip (criterion review/{class}/22KiB) <= 15 us"),
            fmt(skip.map(|c| c.0), 1) + " us",
            skip.map(|c| c.0 <= CORE_SKIP_US),
            stale(skip),
        );
    }
    cpu_targets(&mut report, &cases);
    for case in &cases {
        let p99 = report.med("ours", case, "open1000", "/latency_us/p99");
        report.verdict(
            &format!("p99 <= 1 ms at 1,000 req/s open loop, {case}"),
            format!("{} us", fmt(p99, 0)),
            p99.map(|p| p <= P99_US),
            &format!(
                "p50 {} us, p99.9 {} us (the floor: p99 {} us); rounds {}",
                fmt(report.med("ours", case, "open1000", "/latency_us/p50"), 0),
                fmt(report.med("ours", case, "open1000", "/latency_us/p999"), 0),
                fmt(report.med("floor", case, "open1000", "/latency_us/p99"), 0),
                report
                    .select("ours", case, "open1000")
                    .filter_map(|r| f(&r.v, "/latency_us/p99")
                        .map(|p| format!("{p:.0}{}", if clean(r) { "" } else { "(disturbed)" })))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        );
    }
    if let Some(fl) = &flood {
        let rss = f(fl, "/server/vmhwm_kib").map(|k| k / 1024.0);
        report.verdict(
            "flood: peak RSS <= 32 MiB",
            format!("{} MiB", fmt(rss, 1)),
            rss.map(|r| r <= FLOOD_RSS_MIB),
            &floor_flood
                .as_ref()
                .and_then(|fl0| f(fl0, "/server/vmhwm_kib"))
                .map_or(String::new(), |k| {
                    format!(
                        "the null handler under the same flood: {:.1} MiB",
                        k / 1024.0
                    )
                }),
        );
        let max = f(fl, "/latency_us/max");
        let errors = fl["errors"].as_u64().unwrap_or(0);
        report.verdict(
            "flood: no request waits past the apiserver's 10 s timeout",
            format!(
                "max {} s (all answers and closes), {} x 504, {errors} closed before an answer",
                fmt(max.map(|m| m / 1e6), 3),
                f(fl, "/status/504").unwrap_or(0.0)
            ),
            max.map(|m| m < APISERVER_TIMEOUT_US && f(fl, "/status/504").is_none()),
            &format!(
                "the manifests register the webhook with timeoutSeconds: 5; p99.9 of 200s {} s",
                fmt(f(fl, "/by_status/200/p999").map(|m| m / 1e6), 3)
            ),
        );
    }
    report.verdict(
        "offline inject of 20,000 documents < 2 s",
        format!(
            "{} s on {} CPU(s)",
            fmt(offline_median, 2),
            offline_all.as_ref().map_or(0, |(c, _)| *c)
        ),
        offline_median.map(|s| s < OFFLINE_S),
        // With one CPU (a results file from a one-CPU machine) the figure above is the one-thread run already.
        &match offline_all.as_ref() {
            Some((cpus, _)) if *cpus > 1 => format!(
                "on 1 CPU (one thread) {} s",
                fmt(median(offline_one.clone()), 2)
            ),
            _ => String::new(),
        },
    );
    if !problems.is_empty() {
        report.line("");
        report.line("PROBLEMS (runs with errors, non-200 answers or a dead server):");
        for p in &problems {
            report.line(format!("  {p}"));
        }
    }

    // --- summary JSON ------------------------------------------------------------------------------------------------
    let mut medians = BTreeMap::new();
    for case in &cases {
        for mode in MODES {
            for kind in ["floor", "ours"] {
                if report.select(kind, case, mode).next().is_none() {
                    continue;
                }
                let m = |p: &str| report.med(kind, case, mode, p);
                medians.insert(
                    format!("{kind}/{case}/{mode}"),
                    json!({
                        "rps": m("/rps"),
                        "p50_us": m("/latency_us/p50"),
                        "p99_us": m("/latency_us/p99"),
                        "p999_us": m("/latency_us/p999"),
                        "cpu_us_per_req": m("/server/cpu_us_per_req"),
                        "vmhwm_kib": report.max(kind, case, "/server/vmhwm_kib"),
                    }),
                );
            }
            medians.insert(
                format!("ratio/{case}/{mode}"),
                json!(report.ratio(case, mode)),
            );
        }
    }
    report.summary.insert("meta".into(), meta.clone());
    report.summary.insert("meta_end".into(), meta_end.clone());
    report.summary.insert("medians".into(), json!(medians));
    report
        .summary
        .insert("flood".into(), flood.unwrap_or(Value::Null));
    report
        .summary
        .insert("flood_floor".into(), floor_flood.unwrap_or(Value::Null));
    report.summary.insert(
        "offline_s".into(),
        json!({"runs": offline_all.map(|(_, r)| r), "median": offline_median,
            "one_cpu": {"runs": offline_one, "median": median(offline_one.clone())}}),
    );
    report.summary.insert(
        "criterion_us".into(),
        json!(est
            .iter()
            .map(|((c, s), (us, fresh))| json!({"class": c, "size": s, "median_us": us, "fresh": fresh}))
            .collect::<Vec<_>>()),
    );
    report
        .summary
        .insert("verdicts".into(), json!(report.verdicts));
    report.summary.insert("problems".into(), json!(problems));
    print!("{}", report.text);
    if let Some(path) = summary_path {
        let json = serde_json::to_string_pretty(&report.summary).expect("summary serializes");
        if let Err(e) = std::fs::write(&path, json) {
            eprintln!("bench-report: cannot write {}: {e}", path.display());
        }
    }
    let missed = report.verdicts.iter().any(|v| v["pass"] == json!(false));
    if !problems.is_empty() {
        std::process::exit(3);
    }
    if strict && missed {
        std::process::exit(1);
    }
}
