//! The fencing token: a number that grows on every change of lease holder.

use std::fmt;

/// A fencing token: strictly increases on every change of holder of a role.
///
/// Hand it to the work and stamp every side effect with it; a [`Fence`](crate::Fence)
/// (or a fenced SQL transaction) rejects writes carrying a token lower than one it has
/// already admitted, so a leader that stalled and lost its lease can do no harm.
///
/// # Examples
///
/// ```
/// use tenure::FencingToken;
/// let first = FencingToken::from(1);
/// let second = FencingToken::from(2);
/// assert!(first < second);
/// assert_eq!(second.get(), 2);
/// assert_eq!(second.to_string(), "2");
/// ```
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
#[repr(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The token after this one (saturating; a store would need 2^64 terms to reach it).
    pub const fn next(self) -> Self {
        FencingToken(self.0.saturating_add(1))
    }
}

impl From<u64> for FencingToken {
    fn from(value: u64) -> Self {
        FencingToken(value)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
