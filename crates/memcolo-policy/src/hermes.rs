//! Hermes' proactive file-cache advice (Hermes, Middleware'21 §3.3, §4).
//!
//! TODO(policy helper): implementation and worked-example tests.
