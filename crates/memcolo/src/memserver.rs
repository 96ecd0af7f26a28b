//! `memcolo memserver`: a memory server for far-memory tiers (MaxMem's slow tier on
//! machines without CXL or PMEM). It keeps pages sent by tier managers (the agent, or
//! a process managing itself) in an LZ4 compressed store in its own memory and serves
//! them over TCP with the protocol of `memcolo_tier::wire`; it can run on another
//! machine (real disaggregated memory) or on this one.
//!
//! Every page is checked against its CRC-32 on arrival and on every load; a store is
//! answered only once the page is held. Pages live in memory only: a killed server
//! loses them, and its clients stop the processes that needed them (after a bounded
//! retry), never hand them zeros.

use anyhow::{Context, Result};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::memserver::MemServer;
use std::io::Write;
use std::sync::Arc;

/// Options of `memcolo memserver`.
#[derive(clap::Args, Debug)]
pub struct MemserverArgs {
    /// Address to listen on (`HOST:PORT`; port 0 picks a free port). The server has
    /// no authentication: listen on a private network only.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
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
    let backend = Arc::new(CompressedStore::new(
        args.page_bytes,
        args.capacity_mib << 20,
    ));
    let server = MemServer::bind(&args.listen, backend)
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
