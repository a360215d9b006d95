//! An app on the official OpenFeature Rust flagd provider, in-process: `flagd-probe FLAG:KIND[:KEY=VALUE,...]...`
//! evaluates each flag every `PROBE_EVERY_MS` (100) and prints a JSON line at start-up and whenever a value or
//! an error changes; `PROBE_FOR_S` ends it (else SIGTERM does), with a summary line. The protocol is the same
//! as scripts/flagd-providers' Python and Node probes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use open_feature::{EvaluationContext, OpenFeature};
use open_feature_flagd::{FlagdOptions, FlagdProvider};
use serde_json::{Map, Value, json};

/// One evaluation: a flag, its kind, and the context's custom fields.
struct Probe {
    label: String,
    flag: String,
    kind: Kind,
    context: EvaluationContext,
}

enum Kind {
    Bool,
    String,
}

fn parse(arg: &str) -> Result<Probe, String> {
    let mut parts = arg.splitn(3, ':');
    let flag = parts
        .next()
        .filter(|f| !f.is_empty())
        .ok_or(format!("{arg:?}: no flag name"))?;
    let kind = match parts.next() {
        Some("bool") => Kind::Bool,
        Some("string") => Kind::String,
        other => return Err(format!("{arg:?}: kind {other:?} is not bool or string")),
    };
    let mut context = EvaluationContext::default().with_targeting_key("probe");
    for pair in parts
        .next()
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or(format!("{arg:?}: {pair:?} is not KEY=VALUE"))?;
        context = context.with_custom_field(k, v);
    }
    Ok(Probe {
        label: arg.to_string(),
        flag: flag.to_string(),
        kind,
        context,
    })
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let probes: Result<Vec<Probe>, String> = std::env::args().skip(1).map(|a| parse(&a)).collect();
    let probes = match probes {
        Ok(p) if !p.is_empty() => p,
        Ok(_) => {
            eprintln!("usage: flagd-probe FLAG:KIND[:KEY=VALUE,...]...  (KIND: bool or string)");
            return std::process::ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("flagd-probe: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let every = Duration::from_millis(env_num("PROBE_EVERY_MS", 100));
    let until = std::env::var("PROBE_FOR_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(|s| now() + s);

    // FlagdProvider::new returns once the provider has its first flag configuration (or fails).
    let provider = match FlagdProvider::new(FlagdOptions::default()).await {
        Ok(p) => p,
        Err(e) => {
            println!(
                "{}",
                json!({"event": "error", "t": now(), "message": e.to_string()})
            );
            return std::process::ExitCode::from(3);
        }
    };
    let client = {
        let mut api = OpenFeature::singleton_mut().await;
        api.set_provider(provider).await;
        api.create_client()
    };
    println!("{}", json!({"event": "ready", "t": now()}));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let (mut rounds, mut failed_rounds) = (0u64, 0u64);
    let mut last: Option<Value> = None;
    loop {
        let mut values = Map::new();
        let mut failed = Vec::new();
        for p in &probes {
            let value = match p.kind {
                Kind::Bool => client
                    .get_bool_details(&p.flag, Some(&p.context), None)
                    .await
                    .map(|d| json!(d.value)),
                Kind::String => client
                    .get_string_details(&p.flag, Some(&p.context), None)
                    .await
                    .map(|d| json!(d.value)),
            };
            match value {
                Ok(v) => {
                    values.insert(p.label.clone(), v);
                }
                Err(e) => {
                    values.insert(p.label.clone(), Value::Null);
                    failed.push(json!({"label": p.label, "error": format!("{:?}: {}", e.code, e.message.unwrap_or_default())}));
                }
            }
        }
        rounds += 1;
        if !failed.is_empty() {
            failed_rounds += 1;
        }
        let seen = json!({"values": values, "failed": failed});
        if last.as_ref() != Some(&seen) {
            println!(
                "{}",
                json!({"event": "values", "t": now(), "values": seen["values"], "failed": seen["failed"]})
            );
            last = Some(seen);
        }
        if until.is_some_and(|u| now() >= u) {
            break;
        }
        let stop = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop => break,
        }
    }
    println!(
        "{}",
        json!({"event": "done", "t": now(), "rounds": rounds, "failed_rounds": failed_rounds})
    );
    std::process::ExitCode::SUCCESS
}
