//! What `check` found, and how it is shown: sections of findings, a readable text report (colour only on a
//! terminal), JSON for scripts, and the exit status that says whether anything needs action.

use std::fmt::Write as _;

use serde::Serialize;

/// How much a finding matters. The order is the order of gravity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// In order; shown so the report says what was checked.
    Ok,
    /// Worth knowing, needs no action (for example an endpoint this machine cannot reach).
    Info,
    /// Not broken yet, but will be, or only partly in order (a certificate close to expiry, fewer replicas).
    Warning,
    /// Needs action: exit status 1.
    Error,
}

impl Severity {
    fn mark(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Info => "--",
            Severity::Warning => "!!",
            Severity::Error => "XX",
        }
    }

    /// ANSI colour of the mark.
    fn colour(self) -> &'static str {
        match self {
            Severity::Ok => "\x1b[32m",
            Severity::Info => "\x1b[2m",
            Severity::Warning => "\x1b[33m",
            Severity::Error => "\x1b[31m",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// Stable `snake_case` code, for scripts and alerts (documented in docs/operations.md).
    pub code: String,
    /// What it is about: an object (`Deployment shop/web`, `node worker-1`) or a property.
    pub subject: String,
    /// One line for a human.
    pub message: String,
    /// What fixes it: a command when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The Pods concerned, `namespace/name` (Pods section).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
}

impl Finding {
    /// A finding without fix or Pods.
    pub fn new(
        severity: Severity,
        code: impl Into<&'static str>,
        subject: impl Into<String>,
        message: impl Into<String>,
    ) -> Finding {
        Finding {
            severity,
            code: code.into().to_string(),
            subject: subject.into(),
            message: message.into(),
            fix: None,
            pods: Vec::new(),
        }
    }

    /// The same finding with a fix.
    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(fix.into());
        self
    }
}

/// A part of the report: Install, Nodes, Namespaces, Pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Section {
    /// `install`, `nodes`, `namespaces` or `pods`.
    pub name: &'static str,
    /// What the section covered, e.g. `12 Pods in 3 namespaces`.
    pub summary: String,
    /// Its findings, errors first.
    pub findings: Vec<Finding>,
}

impl Section {
    /// An empty section.
    pub fn new(name: &'static str) -> Section {
        Section {
            name,
            summary: String::new(),
            findings: Vec::new(),
        }
    }

    /// Adds a finding.
    pub fn push(&mut self, f: Finding) {
        self.findings.push(f);
    }

    fn count(&self, s: Severity) -> usize {
        self.findings.iter().filter(|f| f.severity == s).count()
    }
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// True when nothing needs action (no error finding).
    pub ok: bool,
    /// The exit status of the command for this report (see [`Report::exit_code`]).
    pub exit_code: u8,
    /// Number of findings per severity.
    pub counts: Counts,
    /// Install, Nodes, Namespaces, Pods.
    pub sections: Vec<Section>,
}

/// Findings per severity, over all sections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Severity `error`.
    pub error: usize,
    /// Severity `warning`.
    pub warning: usize,
    /// Severity `info`.
    pub info: usize,
    /// Severity `ok`.
    pub ok: usize,
}

/// Exit status: everything checked is in order (warnings and infos allowed).
pub const EXIT_OK: u8 = 0;
/// Exit status: at least one finding needs action.
pub const EXIT_ACTION_NEEDED: u8 = 1;
/// Exit status: the check could not run (no cluster connection, bad flags, a `--config` file that does not
/// load); nothing was judged.
pub const EXIT_CANNOT_CHECK: u8 = 2;

impl Report {
    /// Assembles the report; findings are sorted errors first, keeping their order otherwise.
    pub fn new(mut sections: Vec<Section>) -> Report {
        let mut counts = Counts::default();
        for s in &mut sections {
            s.findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
            counts.error += s.count(Severity::Error);
            counts.warning += s.count(Severity::Warning);
            counts.info += s.count(Severity::Info);
            counts.ok += s.count(Severity::Ok);
        }
        let ok = counts.error == 0;
        Report {
            ok,
            exit_code: if ok { EXIT_OK } else { EXIT_ACTION_NEEDED },
            counts,
            sections,
        }
    }

    /// The command's exit status: [`EXIT_OK`] or [`EXIT_ACTION_NEEDED`].
    pub fn exit_code(&self) -> u8 {
        self.exit_code
    }

    /// The report as pretty JSON (`-o json`).
    pub fn to_json(&self) -> String {
        // Strings, numbers and lists only: serialization cannot fail.
        serde_json::to_string_pretty(self).expect("the report serializes")
    }

    /// The readable report: one block per section, one line per finding, then a summary line.
    pub fn to_text(&self, colour: bool) -> String {
        let paint = |s: Severity, text: &str| {
            if colour {
                format!("{}{text}\x1b[0m", s.colour())
            } else {
                text.to_string()
            }
        };
        let bold = |text: &str| {
            if colour {
                format!("\x1b[1m{text}\x1b[0m")
            } else {
                text.to_string()
            }
        };
        let mut out = String::new();
        for s in &self.sections {
            let title = format!("{}{}", s.name[..1].to_uppercase(), &s.name[1..]);
            let _ = write!(out, "{}", bold(&title));
            if !s.summary.is_empty() {
                let _ = write!(out, " ({})", s.summary);
            }
            out.push('\n');
            if s.findings.is_empty() {
                let _ = writeln!(out, "  {} nothing to report", paint(Severity::Ok, "ok"));
            }
            for f in &s.findings {
                let _ = writeln!(
                    out,
                    "  {} {}: {} [{}]",
                    paint(f.severity, f.severity.mark()),
                    f.subject,
                    f.message,
                    f.code
                );
                if !f.pods.is_empty() {
                    const SHOWN: usize = 5;
                    let mut pods = f.pods.iter().take(SHOWN).cloned().collect::<Vec<_>>();
                    if f.pods.len() > SHOWN {
                        pods.push(format!("and {} more", f.pods.len() - SHOWN));
                    }
                    let _ = writeln!(out, "       pods: {}", pods.join(", "));
                }
                if let Some(fix) = &f.fix {
                    let _ = writeln!(out, "       fix: {fix}");
                }
            }
            out.push('\n');
        }
        let c = self.counts;
        let verdict = if self.ok {
            paint(Severity::Ok, "in order")
        } else {
            paint(Severity::Error, "action needed")
        };
        let _ = writeln!(
            out,
            "{verdict}: {} error(s), {} warning(s), {} info, {} ok",
            c.error, c.warning, c.info, c.ok
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut install = Section::new("install");
        install.push(Finding::new(
            Severity::Ok,
            "config_loaded",
            "config",
            "hash abc",
        ));
        install.push(
            Finding::new(Severity::Error, "webhook_missing", "webhook", "not found")
                .fix("kubectl apply -k manifests/overlays/daemonset"),
        );
        let mut pods = Section::new("pods");
        pods.summary = "2 Pods".into();
        let mut f = Finding::new(Severity::Warning, "stale_config", "Deployment a/web", "x");
        f.pods = (0..7).map(|i| format!("a/web-{i}")).collect();
        pods.push(f);
        Report::new(vec![install, pods])
    }

    #[test]
    fn errors_first_and_exit_status() {
        let r = report();
        assert_eq!(r.sections[0].findings[0].code, "webhook_missing");
        assert_eq!(r.counts.error, 1);
        assert_eq!(r.exit_code(), EXIT_ACTION_NEEDED);
        assert!(!r.ok);
        let fine = Report::new(vec![Section::new("pods")]);
        assert_eq!(fine.exit_code(), EXIT_OK);
    }

    #[test]
    fn text_without_colour_has_no_escapes_and_elides_long_pod_lists() {
        let text = report().to_text(false);
        assert!(!text.contains('\x1b'), "{text}");
        assert!(text.contains("Install\n"), "{text}");
        assert!(text.contains("Pods (2 Pods)"), "{text}");
        assert!(
            text.contains("XX webhook: not found [webhook_missing]"),
            "{text}"
        );
        assert!(text.contains("fix: kubectl apply"), "{text}");
        assert!(text.contains("and 2 more"), "{text}");
        assert!(text.ends_with("action needed: 1 error(s), 1 warning(s), 0 info, 1 ok\n"));
        assert!(report().to_text(true).contains("\x1b[31m"));
    }

    #[test]
    fn json_names_codes_and_exit_status() {
        let v: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(v["exitCode"], 1);
        assert_eq!(v["sections"][0]["findings"][0]["severity"], "error");
        assert_eq!(
            v["sections"][1]["findings"][0]["pods"]
                .as_array()
                .unwrap()
                .len(),
            7
        );
        assert!(v["sections"][0]["findings"][1].get("fix").is_none());
    }
}
