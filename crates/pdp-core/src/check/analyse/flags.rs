//! The flag sync source against its node relays: a relay whose newest state is older than the source's serves
//! its node's Pods stale flags (its stream to the source is cut, or it stopped following).

use crate::check::ClusterView;
use crate::check::analyse::{Read, plural};
use crate::check::codes::FindingCode as Code;
use crate::check::report::{Finding, Section, Severity};

/// What `check` read of the flag sync source and its relays (their `/metrics`, through the apiserver).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagSyncView {
    /// The source's `namespace/name`, for the report.
    pub source_name: String,
    /// The source's generation (`pdp_flag_sync_generation` of a ready source Pod).
    pub source: Read<u64>,
    /// The relay Pods, or why they could not be listed.
    pub relays: Read<Vec<RelayGeneration>>,
}

/// One relay Pod and the source generation it has (`pdp_flag_sync_upstream_generation`; 0: none yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayGeneration {
    pub node: String,
    pub pod: String,
    pub generation: Read<u64>,
}

/// The flag sync findings, in the nodes section; nothing when no source is installed.
pub(super) fn flag_sync_section(view: &ClusterView, section: &mut Section) {
    let Some(flags) = &view.flag_sync else {
        return;
    };
    let what = format!("flag sync {}", flags.source_name);
    let unreadable = |subject: String, why: String| {
        Finding::new(
            Severity::Warning,
            Code::FlagSyncUnreadable,
            subject,
            format!(
                "cannot read its generation ({why}): whether its relays are current is not checked"
            ),
        )
    };
    let source = match &flags.source {
        Ok(g) => *g,
        Err(e) => {
            section.push(unreadable(what, e.clone()));
            return;
        }
    };
    let relays = match &flags.relays {
        Ok(r) => r,
        Err(e) => {
            section.push(unreadable("flag relays".into(), e.clone()));
            return;
        }
    };
    let mut current = 0;
    for relay in relays {
        let subject = format!("node {} (relay {})", relay.node, relay.pod);
        match &relay.generation {
            Err(e) => section.push(unreadable(subject, e.clone())),
            Ok(g) if *g < source => section.push(Finding::new(
                Severity::Warning,
                Code::FlagRelayBehind,
                subject,
                format!(
                    "serves generation {g} of the flag sets, the source {} is at {source}: the node's Pods get older \
                     flags until it follows again (its log says why its stream to the source ended)",
                    flags.source_name
                ),
            )),
            Ok(_) => current += 1,
        }
    }
    if current > 0 && current == relays.len() {
        section.push(Finding::new(
            Severity::Ok,
            Code::FlagRelaysCurrent,
            what,
            format!(
                "{} at the source's generation {source}",
                plural(current, "node relay")
            ),
        ));
    }
}
