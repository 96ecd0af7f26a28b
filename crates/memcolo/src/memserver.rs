//! `memcolo memserver`: a memory server for far-memory tiers (MaxMem's slow tier on
//! machines without CXL or PMEM). It keeps pages sent by tier managers (the agent, or
//! a process managing itself) in an LZ4 compressed store in its own memory and serves
//! them over TCP with the protocol of `memcolo_tier::wire`; it can run on another
//! machine (real disaggregated memory) or on this one.
//!
//! Clients and server authenticate each other with a shared secret
//! (`--secret-file`) and seal every frame (ChaCha20-Poly1305; `memcolo_tier::channel`);
//! without a secret the server refuses to start unless `--insecure-no-auth` is given.
//! Connections are capped (`--max-connections`), and stored pages plus payloads in
//! flight stay within `--capacity-mib`.
//!
//! Every page is checked against its CRC-32 on arrival and on every load; a store is
//! answered only once the page is held. Pages live in memory only: a killed server
//! loses them, and its clients stop the processes that needed them (after a bounded
//! retry), never hand them zeros.

use anyhow::{Context, Result};
use memcolo_tier::channel::Auth;
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::memserver::{MemServer, ServerConfig};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Options of `memcolo memserver`.
#[derive(clap::Args, Debug)]
pub struct MemserverArgs {
    /// Address to listen on (`HOST:PORT`; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// File holding the secret shared with the agents (the agent's
    /// `[tier] slow_secret_file`): a regular file of 32 to 4096 bytes that neither
    /// group nor others may read (`head -c 32 /dev/urandom > FILE; chmod 600 FILE`).
    #[arg(long, value_name = "PATH", conflicts_with = "insecure_no_auth")]
    pub secret_file: Option<PathBuf>,
    /// Serve without authentication: anyone who reaches the port reads and writes
    /// every page. For tests on the loopback interface only.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Connections served at once; the next ones are refused until one closes.
    #[arg(long, default_value_t = 64)]
    pub max_connections: usize,
    /// Memory the stored pages may occupy (compressed bytes plus bookkeeping), MiB;
    /// a store past it is refused (the client keeps the page in local memory).
    #[arg(long, default_value_t = 1024)]
    pub capacity_mib: u64,
    /// Page size, bytes: clients with another page size are refused at connect.
    #[arg(long, default_value_t = 4096)]
    pub page_bytes: usize,
}

/// Binds, prints `listening on ADDR` on stdout (the address actually bound, so a
/// caller that asked for port 0 learns the port), and serves until killed.
///
/// # Errors
/// Binding the address, or the listening socket failing.
pub fn run(args: &MemserverArgs) -> Result<()> {
    anyhow::ensure!(
        args.page_bytes > 0 && args.page_bytes.is_power_of_two(),
        "--page-bytes must be a power of two, not {}",
        args.page_bytes
    );
    anyhow::ensure!(
        args.max_connections > 0,
        "--max-connections must be at least 1"
    );
    let auth = match (&args.secret_file, args.insecure_no_auth) {
        (Some(path), _) => Auth::from_file(path)?,
        (None, true) => {
            tracing::warn!("memserver: --insecure-no-auth: anyone who reaches the port reads and writes every page");
            Auth::InsecureNoAuth
        }
        (None, false) => anyhow::bail!(
            "no --secret-file: the memory server authenticates its clients with a shared secret (or give --insecure-no-auth, for tests on the loopback interface only)"
        ),
    };
    let capacity = args
        .capacity_mib
        .checked_mul(1 << 20)
        .context("--capacity-mib too large")?;
    let backend = Arc::new(CompressedStore::new(args.page_bytes, capacity));
    let cfg = ServerConfig {
        max_connections: args.max_connections,
        ..ServerConfig::new(auth, capacity)
    };
    let server = MemServer::bind(&args.listen, backend, cfg)
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = server.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
    }
    tracing::info!(%addr, capacity_mib = args.capacity_mib, page_bytes = args.page_bytes, "memserver: serving");
    server.run().context("serving")?;
    Ok(())
}
