//! `memcolo doctor`: checks a node before the agent runs. The probes are
//! `memcolo_linux::probe`'s; this module only picks the configuration whose
//! mechanisms count and formats the result, as a table or as JSON (`--json`).
//!
//! Exit status: 0 when every mechanism the configuration turns on (the M3 monitor
//! and libmemcolo always; Hermes advice, Hermit reclaim and MaxMem tiering by their
//! `enabled` settings) can run here, 1 when one cannot, 2 on a usage or
//! configuration error. Warnings (a missing optional feature, a limit) do not change
//! it.

use anyhow::Result;
use memcolo_agent::config::AgentConfig;
use memcolo_linux::probe::{self, Check, Enabled, Roots, Verdict};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The configuration whose mechanisms count (default /etc/memcolo/agent.toml if it
    /// exists, else the defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the checks and verdicts as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs the doctor; an error (unreadable configuration) is printed with
/// `error_chain` and exits 2.
pub fn main(a: &DoctorArgs, error_chain: fn(&anyhow::Error) -> String) -> ExitCode {
    run(a).unwrap_or_else(|e| {
        eprintln!("memcolo: {}", error_chain(&e));
        ExitCode::from(2)
    })
}

fn run(a: &DoctorArgs) -> Result<ExitCode> {
    let cfg = AgentConfig::load(a.config.as_deref())?;
    let roots = Roots {
        procfs: cfg.procfs.clone(),
        ..Roots::default()
    };
    let checks = probe::run(&roots);
    let verdicts = probe::assess(
        &checks,
        Enabled {
            hermes: cfg.hermes.enabled,
            reclaim: cfg.reclaim.enabled,
            tier: cfg.tier.enabled,
            cgroup_scope: cfg.scope.starts_with("cgroup:"),
        },
    );
    let ready = probe::ready(&verdicts);
    if a.json {
        // `ready`: every enabled mechanism can run (the exit status is 0).
        let r = serde_json::json!({
            "ready": ready,
            "checks": checks,
            "mechanisms": verdicts,
        });
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", table(&checks, &verdicts, ready));
    }
    Ok(if ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn table(checks: &[Check], verdicts: &[Verdict], ready: bool) -> String {
    let mut out = String::from("checks\n");
    let w = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in checks {
        out += &format!(
            "  {:<4}  {:<w$}  {}\n",
            c.status.as_str(),
            c.name,
            c.reading
        );
    }
    out += "mechanisms\n";
    let w = verdicts.iter().map(|v| v.title.len()).max().unwrap_or(0);
    for v in verdicts {
        let on = if v.enabled { "on" } else { "off" };
        let run = if v.can_run { "can run" } else { "cannot run" };
        let why = if v.why.is_empty() {
            String::new()
        } else {
            format!(": {}", v.why)
        };
        out += &format!("  {:<w$}  {on:<3}  {run}{why}\n", v.title);
    }
    out += if ready {
        "ready: every mechanism that is on can run\n"
    } else {
        "not ready: a mechanism that is on cannot run\n"
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcolo_linux::probe::Status;

    #[test]
    fn the_table_names_status_reading_and_verdict() {
        let checks = vec![Check {
            name: "swap",
            status: Status::Warn,
            reading: "no swap device".into(),
        }];
        let verdicts = vec![Verdict {
            name: "reclaim",
            title: "Hermit reclaim",
            enabled: false,
            can_run: true,
            why: "no swap: file pages only".into(),
        }];
        let t = table(&checks, &verdicts, true);
        assert!(t.contains("  warn  swap  no swap device\n"), "{t}");
        assert!(
            t.contains("  Hermit reclaim  off  can run: no swap: file pages only\n"),
            "{t}"
        );
        assert!(t.ends_with("ready: every mechanism that is on can run\n"));
    }
}
