//! `memcolo tier`: the agent's MaxMem tiering from the command line — its state
//! (`status`) and a process's target fast-memory miss ratio, changed live (`target`).
//! Talks to the tiering socket (`tier.sock` next to the agent's socket,
//! `docs/protocol.md` §11).

use anyhow::{bail, Context, Result};
use memcolo_proto::tier::{decode_tier_reply, TierReply, TierRequest, TIER_SOCKET_NAME};
use memcolo_proto::{encode, Pid};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// `memcolo tier ...`.
#[derive(clap::Args, Debug)]
pub struct TierArgs {
    /// The agent's socket; the tiering socket is `tier.sock` next to it.
    #[arg(long, global = true, env = "MEMCOLO_SOCKET", default_value = memcolo_proto::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// The tiering socket, if not next to the agent's.
    #[arg(long, global = true, env = "MEMCOLO_TIER_SOCKET")]
    pub tier_socket: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: TierCmd,
}

/// What to do.
#[derive(clap::Subcommand, Debug)]
pub enum TierCmd {
    /// Tiered processes: t_miss, a_miss, fast memory allotted and held, slow memory,
    /// infeasible targets, regions; processes stopped for a lost page.
    Status {
        /// Print the raw JSON state.
        #[arg(long)]
        json: bool,
    },
    /// Set a process's target fast-memory miss ratio, `]0, 1]`, from the next epoch.
    Target {
        /// The process (root may name any).
        #[arg(long)]
        pid: Pid,
        /// The target FMMR.
        #[arg(long)]
        t_miss: f64,
    },
}

fn call(path: &Path, req: &TierRequest) -> Result<TierReply> {
    let mut s = UnixStream::connect(path)
        .with_context(|| format!("connecting to the tiering socket {} (is the agent running with [tier] enabled = true?)", path.display()))?;
    s.write_all(encode(req).as_bytes())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the agent closed the connection");
    }
    let reply = decode_tier_reply(&line).context("decoding the agent's reply")?;
    if let TierReply::Error { code, message } = &reply {
        bail!("{message} ({code:?})");
    }
    Ok(reply)
}

fn mib(v: &serde_json::Value) -> String {
    format!("{:.1}", v.as_f64().unwrap_or(0.0) / (1u64 << 20) as f64)
}

/// Runs `memcolo tier`.
///
/// # Errors
/// No agent, tiering off, or the agent's error.
pub fn run(a: &TierArgs) -> Result<()> {
    let path = a.tier_socket.clone().unwrap_or_else(|| {
        a.socket
            .parent()
            .unwrap_or(Path::new("/"))
            .join(TIER_SOCKET_NAME)
    });
    match &a.cmd {
        TierCmd::Target { pid, t_miss } => {
            call(
                &path,
                &TierRequest::TierTarget {
                    pid: Some(*pid),
                    t_miss: *t_miss,
                },
            )?;
            println!("pid {pid}: t_miss {t_miss} from the next epoch");
        }
        TierCmd::Status { json } => {
            let TierReply::TierStatus { status } = call(&path, &TierRequest::TierStatus)? else {
                bail!("unexpected reply");
            };
            if *json {
                println!("{}", serde_json::to_string_pretty(&status)?);
                return Ok(());
            }
            println!(
                "epoch {}  fast {} MiB, free {} MiB  slow tier {}: {} pages",
                status["epoch"],
                mib(&status["fast_capacity_bytes"]),
                mib(&status["free_bytes"]),
                status["slow"]["kind"].as_str().unwrap_or("?"),
                status["slow"]["pages"]
            );
            println!(
                "{:>8} {:>6} {:>7} {:>9} {:>10} {:>9} {:>9} {:>7} {:>10}",
                "pid",
                "t_miss",
                "a_miss",
                "need",
                "alloc MiB",
                "fast MiB",
                "slow MiB",
                "regions",
                "infeasible"
            );
            for p in status["processes"].as_array().into_iter().flatten() {
                println!(
                    "{:>8} {:>6.3} {:>7.3} {:>9} {:>10} {:>9} {:>9} {:>7} {:>10}",
                    p["pid"],
                    p["t_miss"].as_f64().unwrap_or(0.0),
                    p["a_miss"].as_f64().unwrap_or(0.0),
                    p["need"].as_str().unwrap_or("?"),
                    mib(&p["alloc_bytes"]),
                    mib(&p["fast_bytes"]),
                    mib(&p["slow_bytes"]),
                    p["regions"].as_array().map_or(0, |r| r.len()),
                    if p["infeasible"].as_bool().unwrap_or(false) {
                        "yes"
                    } else {
                        ""
                    }
                );
            }
            for s in status["stopped"].as_array().into_iter().flatten() {
                println!(
                    "stopped pid {}: {}",
                    s["pid"],
                    s["reason"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(())
}
