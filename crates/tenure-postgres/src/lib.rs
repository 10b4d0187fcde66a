//! The postgres backend for tenure (in progress).
