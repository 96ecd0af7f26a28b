//! memcolo's node agent (`memcolo agent`): the sense → decide → act loop that
//! runs the M3 monitor and Hermes' file-cache advice on a scope (the host, or a
//! memory cgroup subtree treated as the node), with a registry of LC, BE and elastic
//! processes, a Unix socket server, Prometheus metrics and a JSON event log.
//!
//! The loop polls every `poll_ms` (1 s by default, as M3 §6) and also right after a
//! kernel pressure event (cgroup v1 `memory.pressure_level`, PSI triggers), so a
//! burst is acted on long before the next tick. All state lives in one
//! [`core::Core`] owned by the main loop; connections, event sources and pidfd
//! watchers are tasks that send it messages.

pub mod advice;
pub mod async_reclaim;
pub mod config;
pub mod core;
pub mod eventlog;
pub mod kubernetes;
pub mod mechanisms;
pub mod metrics;
pub mod registry;
pub mod server;
pub mod slots;
pub mod snapshot;
pub mod tier;

use crate::config::AgentConfig;
use crate::core::{Core, ExitWatcher, Trigger};
use crate::metrics::Metrics;
use crate::server::Command;
use memcolo_linux::actuate::LinuxActuator;
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::Scope;
use memcolo_policy::Pid;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Monotonic time since boot (`CLOCK_BOOTTIME`), the epoch of process start times.
pub fn boot_time_now() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is always available on Linux");
    Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}

/// Watches registered processes with pidfds: each pid's fd becomes readable when
/// the process exits, and its pid is sent to the main loop.
pub struct PidfdWatcher {
    exits: mpsc::UnboundedSender<Pid>,
    tasks: HashMap<Pid, JoinHandle<()>>,
}

impl PidfdWatcher {
    pub fn new(exits: mpsc::UnboundedSender<Pid>) -> Self {
        PidfdWatcher {
            exits,
            tasks: HashMap::new(),
        }
    }
}

impl ExitWatcher for PidfdWatcher {
    fn watch(&mut self, pid: Pid, fd: OwnedFd) -> std::io::Result<()> {
        // SAFETY: an OwnedFd stays open and is the same fd for the AsyncFd's lifetime.
        let afd = unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)?;
        let exits = self.exits.clone();
        if let Some(old) = self.tasks.remove(&pid) {
            old.abort();
        }
        self.tasks.insert(
            pid,
            tokio::spawn(async move {
                // A pidfd turns readable once, when the process exits.
                if afd.readable().await.is_ok() {
                    let _ = exits.send(pid);
                }
            }),
        );
        Ok(())
    }

    fn unwatch(&mut self, pid: Pid) {
        if let Some(t) = self.tasks.remove(&pid) {
            t.abort();
        }
    }
}

/// Waits on a kernel event fd and forwards each firing. `pri` selects POLLPRI
/// (PSI triggers) rather than readability (eventfds).
fn spawn_event_source(
    name: &'static str,
    fd: OwnedFd,
    pri: bool,
    events: mpsc::Sender<&'static str>,
) {
    tokio::spawn(async move {
        let interest = if pri {
            tokio::io::Interest::PRIORITY
        } else {
            tokio::io::Interest::READABLE
        };
        // SAFETY: an OwnedFd stays open and is the same fd for the AsyncFd's lifetime.
        let afd = match unsafe { AsyncFd::register_with_interest(fd, interest) }
            .map_err(std::io::Error::from)
        {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(source = name, error = %e, "cannot poll pressure event fd");
                return;
            }
        };
        loop {
            let mut guard = match afd.ready(interest).await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(source = name, error = %e, "pressure event source failed");
                    return;
                }
            };
            if !pri {
                let mut b = [0u8; 8];
                // Resets the eventfd counter; EAGAIN means another reader got it.
                let _ = nix::unistd::read(afd.get_ref().as_raw_fd(), &mut b);
            }
            guard.clear_ready();
            if events.send(name).await.is_err() {
                return;
            }
            if pri {
                // PSI re-arms once per window at most: don't spin on a level-triggered POLLPRI.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
}

/// Usage thresholds, bytes, that trigger a poll on a cgroup v1 scope of
/// `scope_bytes`: every M3 step from the initial low threshold up to (not including)
/// the scope's limit, the top among them.
fn usage_threshold_marks(cfg: &AgentConfig, scope_bytes: u64) -> Vec<u64> {
    let m3 = cfg.m3_config(scope_bytes);
    let step = m3.step_bytes.max(1);
    let mut marks: Vec<u64> = (0..)
        .map(|k| m3.low_bytes.saturating_add(k * step))
        .take_while(|b| *b < scope_bytes)
        .take(256)
        .collect();
    if m3.top_bytes < scope_bytes && !marks.contains(&m3.top_bytes) {
        marks.push(m3.top_bytes);
        marks.sort_unstable();
    }
    marks
}

/// Registers the kernel pressure events the scope offers.
fn start_event_sources(
    cfg: &AgentConfig,
    scope: &Scope,
    procfs: &ProcFs,
    tx: mpsc::Sender<&'static str>,
) {
    match scope {
        Scope::Cgroup(cg) => {
            if cg.version() == memcolo_linux::cgroup::CgroupVersion::V1
                && cfg.events.v1_pressure_level != "off"
            {
                match memcolo_linux::events::v1_pressure_level_eventfd(
                    cg,
                    &cfg.events.v1_pressure_level,
                    "hierarchy",
                ) {
                    Ok(fd) => spawn_event_source("v1_pressure_level", fd, false, tx.clone()),
                    Err(e) => tracing::warn!(error = %e, "no v1 memory.pressure_level events"),
                }
            }
            if cg.version() == memcolo_linux::cgroup::CgroupVersion::V1
                && cfg.events.v1_usage_thresholds
            {
                let marks = scope
                    .sample_with_host(procfs)
                    .map(|s| usage_threshold_marks(cfg, s.total_bytes))
                    .unwrap_or_default();
                match memcolo_linux::events::v1_usage_threshold_eventfd(cg, &marks) {
                    Ok(fd) => spawn_event_source("v1_usage_threshold", fd, false, tx.clone()),
                    Err(e) => tracing::warn!(error = %e, "no v1 memory usage thresholds"),
                }
            }
            if cg.version() == memcolo_linux::cgroup::CgroupVersion::V2
                && cfg.events.psi_stall_us > 0
            {
                let p = cg.path().join("memory.pressure");
                match memcolo_linux::events::psi_trigger(
                    &p,
                    false,
                    cfg.events.psi_stall_us,
                    cfg.events.psi_window_us,
                ) {
                    Ok(fd) => spawn_event_source("psi", fd, true, tx.clone()),
                    Err(e) => tracing::warn!(error = %e, "no PSI trigger on the cgroup"),
                }
            }
        }
        Scope::Host(_) => {
            if cfg.events.psi_stall_us > 0 {
                let p = procfs.path().join("pressure/memory");
                match memcolo_linux::events::psi_trigger(
                    &p,
                    false,
                    cfg.events.psi_stall_us,
                    cfg.events.psi_window_us,
                ) {
                    Ok(fd) => spawn_event_source("psi", fd, true, tx),
                    Err(e) => tracing::warn!(error = %e, "no PSI trigger on the host"),
                }
            }
        }
    }
}

/// `GET /healthz`'s answer when the main loop last polled at `last_poll_s` and it is
/// `now_s` (Unix seconds): 200 while the last poll is at most `max_gap_s` old (also
/// before the first poll, while the agent starts), 503 saying how old it is after.
/// A stuck main loop (a poll that never ends) is what a liveness probe should
/// restart; a slow API server or client never makes it so.
pub fn health(last_poll_s: i64, now_s: i64, max_gap_s: i64) -> (u16, String) {
    let age = now_s.saturating_sub(last_poll_s);
    if last_poll_s == 0 || age <= max_gap_s {
        (200, "ok\n".into())
    } else {
        (
            503,
            format!("no poll for {age} s (more than {max_gap_s} s): the main loop is stuck\n"),
        )
    }
}

async fn serve_metrics(
    addr: String,
    metrics: Arc<Metrics>,
    max_gap_s: i64,
) -> anyhow::Result<JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?;
    let m2 = metrics.clone();
    let app = axum::Router::new().route(
        "/healthz",
        axum::routing::get(move || {
            let m = m2.clone();
            async move {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0);
                let (code, body) = health(m.last_poll_timestamp.get(), now, max_gap_s);
                (
                    axum::http::StatusCode::from_u16(code)
                        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
                    body,
                )
            }
        }),
    );
    let app = app.route(
        "/metrics",
        axum::routing::get(move || {
            let m = metrics.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    m.render(),
                )
            }
        }),
    );
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    }))
}

/// The API side of Kubernetes mode: a worker on the kube-rs client and the pod
/// watch's feed; without a client (none configured, or built without the
/// `kube-client` feature), a worker whose every call is unreachable, so that pods are
/// classed from their cgroup path and only the SIGKILL fallback above top acts.
async fn kube_api(
    node: &str,
) -> (
    kubernetes::ApiWorker,
    Option<tokio::sync::watch::Receiver<Arc<Vec<kubernetes::PodMeta>>>>,
) {
    #[cfg(feature = "kube-client")]
    match kubernetes::client::KubeRsApi::from_env().await {
        Ok(api) => {
            let feed = kubernetes::client::spawn_pod_watch(api.client(), node);
            return (kubernetes::ApiWorker::spawn(api), Some(feed));
        }
        Err(e) => {
            tracing::warn!(error = %e, "Kubernetes mode without an API client: pods are classed by QoS class and killed above top");
        }
    }
    #[cfg(not(feature = "kube-client"))]
    tracing::warn!(
        node,
        "built without the kube-client feature: pods are classed by QoS class and killed above top"
    );
    (kubernetes::ApiWorker::spawn(kubernetes::api::NoApi), None)
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(mut cfg: AgentConfig) -> anyhow::Result<()> {
    cfg.validate()?;
    // Kubernetes mode: the node is the kubelet's kubepods group.
    if cfg.kubernetes.enabled {
        let procfs = ProcFs::new(cfg.procfs.clone());
        cfg.scope = cfg
            .kubernetes
            .scope(|s| Scope::parse(s, procfs.clone()).is_ok())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "kubernetes: no kubepods cgroup (kubepods or kubepods.slice) below the \
                     memory cgroup mounts; set kubernetes.kubepods_cgroup"
                )
            })?;
    }
    // First of all: nothing (a stale socket, the reclaim journals, the registry) is
    // touched while another agent owns the state directory. Held until we return.
    let _state_lock = registry::lock_state_dir(&cfg.state_dir)?;
    let procfs = ProcFs::new(cfg.procfs.clone());
    // The error names the scope already.
    let scope = Scope::parse(&cfg.scope, ProcFs::new(cfg.procfs.clone()))?;
    let listener = server::bind(&cfg.socket).await?;
    let metrics = Arc::new(Metrics::new());
    let events = eventlog::EventLog::open(&cfg.event_log)
        .map_err(|e| anyhow::anyhow!("cannot open event log {}: {e}", cfg.event_log))?;
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel();
    let (cmd_tx, mut cmd_rx) = mpsc::channel::<Command>(1024);
    let (ev_tx, mut ev_rx) = mpsc::channel::<&'static str>(16);
    start_event_sources(&cfg, &scope, &procfs, ev_tx);
    let metrics_task = if cfg.metrics_addr != "off" {
        // The main loop polls every poll_ms (and on pressure events): ten missed polls,
        // and at least 30 s, is a stuck loop.
        let max_gap_s = ((cfg.poll_ms as i64 * 10) / 1000).max(30);
        Some(serve_metrics(cfg.metrics_addr.clone(), metrics.clone(), max_gap_s).await?)
    } else {
        None
    };
    let poll = cfg.poll_interval();
    let min_gap = Duration::from_millis(cfg.events.min_gap_ms);
    let socket = cfg.socket.clone();
    let limits = cfg.limits.clone();
    let mut mechanisms = mechanisms::Mechanisms::from_config(&cfg);
    // Reclaim is on by default too: where it cannot start, the agent runs without it
    // and says why.
    let reclaim = if cfg.reclaim.enabled {
        match async_reclaim::AsyncReclaimService::start(&cfg, metrics.clone()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "Hermit reclaim cannot start; running without it");
                mechanisms.reclaim = mechanisms::Switch::Off(format!("cannot start: {e}"));
                None
            }
        }
    } else {
        None
    };
    // Tiering is on by default: where it cannot run, the agent runs without it and
    // says why (status `mechanisms_off`).
    let tier = if cfg.tier.enabled {
        match tier::TierService::start(&cfg.tier, &cfg.socket, &procfs, &metrics) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "MaxMem tiering cannot start; running without it");
                mechanisms.tier = mechanisms::Switch::Off(format!("cannot start: {e}"));
                None
            }
        }
    } else {
        None
    };
    let core_hermes_enabled = cfg.hermes.enabled;
    let kube = if cfg.kubernetes.enabled {
        let Scope::Cgroup(cg) = &scope else {
            anyhow::bail!("kubernetes: the scope is not a cgroup");
        };
        let k = &cfg.kubernetes;
        let node = k.node_name.clone().ok_or_else(|| {
            anyhow::anyhow!("kubernetes: no node name (--node-name or NODE_NAME)")
        })?;
        let (api, feed) = kube_api(&node).await;
        let mut kn = kubernetes::KubeNode::new(
            kubernetes::KubeNodeConfig {
                node: node.clone(),
                kubepods: cg.path().to_path_buf(),
                burstable_class: k.burstable_class,
                trusted_namespaces: k.trusted_namespaces.clone(),
                eviction_grace_period_s: k.eviction_grace_period_s,
                kill_after: Duration::from_secs(cfg.m3.kill_after_s),
                publish_interval: Duration::from_secs(k.publish_interval_s),
            },
            procfs.clone(),
            Box::new(LinuxActuator),
            api,
        );
        if let Some(feed) = feed {
            kn.attach_pod_feed(feed);
        }
        tracing::info!(node = %node, kubepods = %cg.path().display(), "Kubernetes mode");
        Some(kn)
    } else {
        None
    };
    let mut core = Core::new(
        cfg,
        scope,
        Box::new(LinuxActuator),
        Box::new(PidfdWatcher::new(exit_tx)),
        Box::new(memcolo_linux::identity::LinuxProver {
            procfs: procfs.clone(),
        }),
        metrics.clone(),
        events,
    )?;
    if core_hermes_enabled {
        let link = advice::start(procfs.clone(), Box::new(LinuxActuator))
            .map_err(|e| anyhow::anyhow!("cannot start the Hermes advice thread: {e}"))?;
        core.attach_advice(link);
    }
    let reclaim = reclaim.map(|(service, link)| {
        core.attach_reclaim(link);
        service
    });
    if let Some(k) = kube {
        core.attach_kubernetes(k);
        if let Some(t) = &tier {
            core.attach_tier_defaults(t.defaults());
        }
    }
    tracing::info!("mechanisms: {}", mechanisms.summary());
    core.set_mechanisms(mechanisms);
    tracing::info!(status = %core.status_json(), "memcolo agent started");
    let server_task = tokio::spawn(server::serve(listener, cmd_tx, limits, procfs));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Changes to the registry are written at most once per interval, not once each.
    let mut flush = tokio::time::interval(registry::FLUSH_INTERVAL);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_poll = Instant::now() - min_gap;
    // An event within `min_gap` of the last poll is not dropped: it polls when the gap
    // has passed (a usage threshold crossed just after a poll must still be seen).
    let mut deferred: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                core.poll(boot_time_now(), Trigger::Tick);
                last_poll = Instant::now();
                deferred = None;
            }
            _ = tokio::time::sleep_until(deferred.unwrap_or_else(Instant::now).into()), if deferred.is_some() => {
                core.poll(boot_time_now(), Trigger::Event);
                last_poll = Instant::now();
                deferred = None;
            }
            Some(src) = ev_rx.recv() => {
                metrics.pressure_events.with_label_values(&[src]).inc();
                if last_poll.elapsed() >= min_gap {
                    core.poll(boot_time_now(), Trigger::Event);
                    last_poll = Instant::now();
                    deferred = None;
                } else {
                    deferred.get_or_insert(last_poll + min_gap);
                }
            }
            Some(cmd) = cmd_rx.recv() => match cmd {
                Command::Opened { conn, push } => core.conn_opened(conn, push),
                Command::Closed { conn } => core.conn_closed(conn),
                Command::Request { conn, peer, req, reply } => {
                    let r = core.handle(conn, &peer, req, boot_time_now());
                    let _ = reply.send(r);
                }
            },
            Some(pid) = exit_rx.recv() => core.process_exited(pid),
            _ = flush.tick() => {
                core.flush_state();
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!("memcolo agent stopping");
    server_task.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    if let Some(r) = reclaim {
        r.stop();
    }
    if let Some(t) = tier {
        t.stop();
    }
    core.shutdown();
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn health_is_the_age_of_the_last_poll() {
        assert_eq!(health(0, 1_000, 30).0, 200, "starting");
        assert_eq!(health(990, 1_000, 30).0, 200);
        assert_eq!(health(970, 1_000, 30).0, 200);
        let (code, body) = health(960, 1_000, 30);
        assert_eq!(code, 503);
        assert!(body.contains("no poll for 40 s"), "{body}");
    }

    use super::*;

    #[test]
    fn usage_threshold_marks_step_from_low_to_the_limit() {
        // 2 GiB scope: top = 2048 × 31/32 = 1984 MiB, low = top × 50/62 = 1600 MiB,
        // step 2 % of top = 39.68 MiB: marks 1600, 1639.68, ... below 2048, and the top.
        let cfg = AgentConfig::default();
        let mib = 1u64 << 20;
        let m3 = cfg.m3_config(2048 * mib);
        let marks = usage_threshold_marks(&cfg, 2048 * mib);
        assert_eq!(marks[0], m3.low_bytes);
        assert!(marks.contains(&m3.top_bytes));
        assert!(marks.iter().all(|b| *b < 2048 * mib));
        assert!(marks.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(marks.len(), 13);
    }
}
