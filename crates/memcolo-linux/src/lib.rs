//! TODO(linux helper)
