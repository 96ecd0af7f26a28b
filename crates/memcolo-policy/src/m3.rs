//! The M3 node monitor (M3, EuroSys'21 §5 and §6), as a pure state machine.
//!
//! The monitor is configured with a *top* of memory (the bytes applications may use)
//! and two thresholds below it that partition usage into zones: green (< low),
//! yellow (low..high), red (high..top) and above top. Every poll the caller hands
//! [`Monitor::step`] the node's used bytes and the registered processes; the monitor
//! answers with [`Action`]s:
//! - yellow or worse: a `Low` signal to every notifiable process (M3 §3);
//! - red: `High` signals to the processes chosen by Algorithm 1 (M3 §5.1) until their
//!   expected reclamation covers `used - high`;
//! - above top: `Top` signals to every notifiable process; above top for longer than
//!   `kill_after`, BE processes are killed in Algorithm 1 order until their RSS covers
//!   `used - top` (M3 §5.1, last paragraph). LC and elastic processes are never killed.
//!
//! The low and high thresholds adapt by the time-in-red ratio rule of M3 §5.2.
//!
//! TODO(policy helper): implementation and worked-example tests.
