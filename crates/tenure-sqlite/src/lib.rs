//! The sqlite backend for tenure (in progress).
