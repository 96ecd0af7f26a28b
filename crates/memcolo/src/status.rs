//! `memcolo status`: the agent's state as a table, or as JSON with `--json`.

use crate::client::Client;
use anyhow::{bail, Result};
use memcolo_proto::{Reply, Request};
use serde_json::Value;
use std::path::Path;

/// Fetches the agent's state, every page of registered processes (protocol
/// `status`, `offset`/`next_offset`) joined into one `processes` array.
pub fn fetch(socket: &Path) -> Result<Value> {
    let mut c = Client::connect(socket)?;
    let mut offset = 0u64;
    let mut whole: Option<Value> = None;
    loop {
        let mut page = match c.call_ok(&Request::Status { offset })? {
            Reply::Status { status } => status,
            r => bail!("unexpected reply {r:?}"),
        };
        let next = page["next_offset"].as_u64();
        let procs = page["processes"].take();
        let w = whole.get_or_insert(page);
        match (w["processes"].as_array_mut(), procs) {
            (Some(all), Value::Array(more)) => all.extend(more),
            (_, more) => w["processes"] = more,
        }
        match next {
            Some(n) if n > offset => offset = n,
            Some(n) => bail!("the agent's status page at {offset} points back to {n}"),
            None => break,
        }
    }
    let mut w = whole.unwrap_or(Value::Null);
    if let Some(obj) = w.as_object_mut() {
        obj.remove("next_offset");
        obj.remove("processes_offset");
    }
    Ok(w)
}

/// Bytes as MiB with one decimal.
pub fn mib(v: &Value) -> String {
    v.as_u64()
        .map(|b| format!("{:.1}", b as f64 / (1u64 << 20) as f64))
        .unwrap_or_else(|| "-".into())
}

/// Bytes per second as MiB/s with one decimal.
fn rate_mib(v: &Value) -> String {
    v.as_f64()
        .map(|b| format!("{:.1}", b / (1u64 << 20) as f64))
        .unwrap_or_else(|| "-".into())
}

/// The sampled page-turnaround line: quantiles (`>H s` when one falls among the
/// pages censored at the horizon H), refaults and censorings in the window, pages
/// followed now.
fn turnaround_line(t: &Value) -> String {
    let horizon = t["horizon_s"].as_f64().unwrap_or(f64::INFINITY);
    let q = |v: &Value| match v.as_f64() {
        Some(s) if s >= horizon => format!(">{s:.0} s"),
        Some(s) => format!("{s:.2} s"),
        None => "-".into(),
    };
    format!(
        "page turnaround (sampled): p50 {}  p90 {}  p99 {}  ({} refaulted, {} censored in the last {}-{} s; {} followed)",
        q(&t["p50_s"]),
        q(&t["p90_s"]),
        q(&t["p99_s"]),
        t["refaulted"],
        t["censored"],
        t["window_s"].as_f64().unwrap_or(0.0),
        2.0 * t["window_s"].as_f64().unwrap_or(0.0),
        t["tracked"],
    )
}

/// `mechanisms: m3 on  advice on  reclaim on  tier off (tier.enabled = false)`,
/// from the status's `mechanisms` and `mechanisms_off`; `None` from an agent that
/// reports neither.
fn mechanisms_line(s: &Value) -> Option<String> {
    let on = s["mechanisms"].as_object()?;
    // The agent's order (M3 first), then any this client does not know.
    const ORDER: [&str; 4] = ["m3", "advice", "reclaim", "tier"];
    let mut names: Vec<&String> = on.keys().collect();
    names.sort_by_key(|n| ORDER.iter().position(|o| o == n).unwrap_or(ORDER.len()));
    let words: Vec<String> = names
        .into_iter()
        .map(
            |name| match (on[name].as_bool(), s["mechanisms_off"][name].as_str()) {
                (Some(true), _) => format!("{name} on"),
                (_, Some(why)) => format!("{name} off ({why})"),
                _ => format!("{name} off"),
            },
        )
        .collect();
    Some(format!("mechanisms: {}", words.join("  ")))
}

/// The status as text lines (shared with `memcolo top`).
pub fn render(s: &Value) -> Vec<String> {
    let m = &s["memory"];
    let t = &s["thresholds"];
    let c = &s["counters"];
    let mut out = vec![
        format!(
            "scope {}   zone {}   polls {}   poll {} ms",
            s["scope"].as_str().unwrap_or("?"),
            s["zone"].as_str().unwrap_or("?"),
            s["polls"].to_string(),
            s["poll_ms"].to_string()
        ),
        format!(
            "memory MiB: total {}  used {}  working set {}  file {}  anon {}  swap {}",
            mib(&m["total_bytes"]),
            mib(&m["used_bytes"]),
            mib(&m["working_set_bytes"]),
            mib(&m["file_bytes"]),
            mib(&m["anon_bytes"]),
            mib(&m["swap_used_bytes"])
        ),
        format!(
            "thresholds MiB: low {}  high {}  top {}  adv_thr {}",
            mib(&t["low_bytes"]),
            mib(&t["high_bytes"]),
            mib(&t["top_bytes"]),
            mib(&t["adv_thr_bytes"])
        ),
        format!(
            "file cache dropped {} MiB   kills {}   outstanding notifications {}   dropped notifications {}",
            mib(&c["file_cache_dropped_bytes"]),
            c["kills"],
            c["outstanding_notifications"],
            c["dropped_notifications"]
        ),
    ];
    if let Some(line) = mechanisms_line(s) {
        out.insert(1, line);
    }
    let r = &s["reclaim"];
    if r.is_object() {
        out.push(format!(
            "reclaim {}: workers {}/{} (budget {})  headroom {}  low {}  high {} MiB  alloc {} MiB/s  refault {} MiB/s  turnaround {}",
            r["state"].as_str().unwrap_or("?"),
            r["workers_active"],
            r["workers_desired"],
            r["workers_budget"],
            mib(&r["headroom_bytes"]),
            mib(&r["low_mark_bytes"]),
            mib(&r["high_mark_bytes"]),
            rate_mib(&r["alloc_rate_bytes_per_s"]),
            rate_mib(&r["refault_bytes_per_s"]),
            r["turnaround_s"]
                .as_f64()
                .map(|t| format!(
                    "{}{t:.1} s ({})",
                    if r["turnaround_at_least"] == true { ">" } else { "" },
                    r["turnaround_source"].as_str().unwrap_or("?")
                ))
                .unwrap_or_else(|| "inf".into()),
        ));
        out.push(format!(
            "reclaimed {} MiB in {} batches, {:.2} CPU s ({} CPU s/GiB), {} errors, targets: {}",
            mib(&r["reclaimed_bytes_total"]),
            r["batches_total"],
            r["cpu_seconds_total"].as_f64().unwrap_or(0.0),
            r["cpu_seconds_per_gib"]
                .as_f64()
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "-".into()),
            r["errors_total"],
            r["targets"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .map(|x| {
                            format!(
                                "{} ({})",
                                x["id"].as_str().unwrap_or("?"),
                                x["mechanism"].as_str().unwrap_or("?")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| "none".into()),
        ));
        let t = &r["turnaround_sampled"];
        if t.is_object() {
            out.push(turnaround_line(t));
        }
    }
    // NOTIFIED counts every notification of every level and channel (socket message
    // or real-time signal); NOTIFY/MIN is low/high/top sent in the last 60 s;
    // RECL KiB/s is what the process reported reclaimed in the last 60 s, per second;
    // EPOCH its measured answer time (M3 rule R9). A `!` after RECLAIMED marks
    // reported reclamation its RSS does not show (rule R10).
    let row = |c: [&str; 11]| {
        format!(
            "{:>8} {:<8} {:<20} {:>10} {:>6} {:>8} {:>11} {:>12} {:>10} {:>12} {:>8}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10]
        )
    };
    out.extend([
        String::new(),
        row([
            "PID",
            "CLASS",
            "NAME",
            "RSS MiB",
            "DESC",
            "NOTIFIED",
            "NOTIFY/MIN",
            "RECLAIMED",
            "RECL KiB/s",
            "EXPECTED",
            "EPOCH",
        ]),
    ]);
    let mut unmatched = false;
    for p in s["processes"].as_array().into_iter().flatten() {
        let flagged = p["reclaim_unmatched"] == true;
        unmatched |= flagged;
        let per_min = &p["notifications_per_min"];
        let per_min = if per_min.is_object() {
            format!("{}/{}/{}", per_min["low"], per_min["high"], per_min["top"])
        } else {
            "-".into()
        };
        let name: String = p["name"].as_str().unwrap_or("?").chars().take(20).collect();
        out.push(row([
            &p["pid"].to_string(),
            p["class"].as_str().unwrap_or("?"),
            &name,
            &mib(&p["rss_bytes"]),
            &p["descendants"]
                .as_u64()
                .map(|d| d.to_string())
                .unwrap_or_else(|| "-".into()),
            &p["notifications_sent"].to_string(),
            &per_min,
            &format!(
                "{}{}",
                mib(&p["reclaimed_bytes"]),
                if flagged { "!" } else { "" }
            ),
            &p["reclaim_bytes_per_s"]
                .as_f64()
                .map(|b| format!("{:.1}", b / 1024.0))
                .unwrap_or_else(|| "-".into()),
            &mib(&p["expected_reclaim_bytes"]),
            &p["epoch_ms"]
                .as_u64()
                .map(|ms| format!("{:.1} s", ms as f64 / 1000.0))
                .unwrap_or_else(|| "-".into()),
        ]));
    }
    out.push(String::new());
    out.push(
        "NOTIFIED: notifications of every level and channel; NOTIFY/MIN: low/high/top in the last 60 s; \
         RECL KiB/s: reported reclaim over the last 60 s; EPOCH: time to answer (R9)"
            .into(),
    );
    if unmatched {
        out.push(
            "! reported reclamation not matched by a fall of the process's RSS (reclaim_unmatched: >= 64 MiB in 60 s, RSS fell by less than a quarter)"
                .into(),
        );
    }
    out
}

pub fn status(socket: &Path, json: bool) -> Result<()> {
    let s = fetch(socket)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        for l in render(&s) {
            println!("{l}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_counts_notifications_of_every_channel_under_one_name() {
        let s = serde_json::json!({"processes": [
            {"pid": 7, "class": "elastic", "name": "cache", "rss_bytes": 1048576,
             "descendants": 0, "notifications_sent": 3, "reclaimed_bytes": 0,
             "expected_reclaim_bytes": 0}
        ]});
        let lines = render(&s);
        let header = lines.iter().find(|l| l.contains("PID")).unwrap();
        // Socket notifications count too: the column is not "signals".
        assert!(header.contains("NOTIFIED"), "{header}");
        assert!(!header.contains("SIGNALS"), "{header}");
        let row = lines
            .iter()
            .find(|l| l.trim_start().starts_with("7 "))
            .unwrap();
        assert!(row.contains(" 3 "), "{row}");
    }

    #[test]
    fn the_table_shows_rates_and_marks_unmatched_reclaim() {
        let s = serde_json::json!({"processes": [
            {"pid": 7, "class": "elastic", "name": "cache", "rss_bytes": 555 << 20,
             "descendants": 0, "notifications_sent": 1109,
             "notifications_per_min": {"low": 54, "high": 2, "top": 0},
             "reclaimed_bytes": 6u64 << 30, "reclaim_bytes_per_s": 8.0 * 1024.0 * 1024.0,
             "reclaim_unmatched": true, "epoch_ms": 1500, "expected_reclaim_bytes": 0},
            {"pid": 8, "class": "be", "name": "batch", "rss_bytes": 1 << 20,
             "descendants": 0, "notifications_sent": 0,
             "notifications_per_min": {"low": 0, "high": 0, "top": 0},
             "reclaimed_bytes": 0, "reclaim_bytes_per_s": 0.0,
             "reclaim_unmatched": false, "epoch_ms": null, "expected_reclaim_bytes": 0}
        ]});
        let lines = render(&s);
        let header = lines.iter().find(|l| l.contains("PID")).unwrap();
        assert!(
            header.contains("NOTIFY/MIN") && header.contains("RECL KiB/s"),
            "{header}"
        );
        let cache = lines
            .iter()
            .find(|l| l.trim_start().starts_with("7 "))
            .unwrap();
        assert!(cache.contains("54/2/0"), "{cache}");
        assert!(cache.contains("6144.0!"), "{cache}");
        assert!(cache.contains("8192.0"), "{cache}");
        assert!(cache.contains("1.5 s"), "{cache}");
        let batch = lines
            .iter()
            .find(|l| l.trim_start().starts_with("8 "))
            .unwrap();
        assert!(!batch.contains('!'), "{batch}");
        assert!(lines
            .iter()
            .any(|l| l.starts_with("! reported reclamation")));
        // Nothing flagged: no legend for it.
        let s = serde_json::json!({"processes": [s["processes"][1].clone()]});
        assert!(!render(&s).iter().any(|l| l.starts_with("! ")));
    }

    #[test]
    fn the_sampled_turnaround_shows_its_quantiles_and_the_censored_tail() {
        let s = serde_json::json!({
            "reclaim": {
                "state": "reclaiming", "targets": [],
                "turnaround_sampled": {
                    "p50_s": 1.5, "p90_s": 30.0, "p99_s": 120.0, "refaulted": 40,
                    "censored": 2, "tracked": 17, "horizon_s": 120.0, "window_s": 60.0,
                }
            }
        });
        let lines = render(&s);
        let l = lines
            .iter()
            .find(|l| l.starts_with("page turnaround"))
            .expect("a turnaround line");
        assert!(l.contains("p50 1.50 s  p90 30.00 s  p99 >120 s"), "{l}");
        assert!(
            l.contains("40 refaulted, 2 censored in the last 60-120 s; 17 followed"),
            "{l}"
        );
        // Nothing sampled yet: dashes.
        let s = serde_json::json!({"reclaim": {"turnaround_sampled": {"horizon_s": 120.0}}});
        let lines = render(&s);
        assert!(lines.iter().any(|l| l.contains("p50 -  p90 -  p99 -")));
    }
}
