//! Fences: the compare-and-reject that makes a fencing token protect anything.
//!
//! A token only helps where a write is checked against it. [`Fence`] is the in-memory
//! check, one highest-admitted token per resource; SQL backends offer the same check
//! inside the caller's own transaction.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::{Error, FencingToken, Result};

/// Per resource, the highest token admitted; lower tokens are rejected.
///
/// A term may write many times, so a token equal to the highest is admitted.
///
/// # Examples
///
/// ```
/// use tenure::{Error, Fence, FencingToken};
/// let fence = Fence::new();
/// fence.admit("ledger", FencingToken::from(2)).unwrap();
/// let late = fence.admit("ledger", FencingToken::from(1));
/// assert!(matches!(late, Err(Error::Fenced { presented, highest })
///     if presented.get() == 1 && highest.get() == 2));
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<HashMap<String, FencingToken>>,
}

impl Fence {
    /// An empty fence: every resource admits any first token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits `token` for `resource` if it is at least the highest admitted so far, and
    /// records it; otherwise returns [`Error::Fenced`]. Check and record are one step.
    pub fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        crate::lease::validate_name("resource", resource)?;
        let mut highest = self.highest.lock();
        match highest.get_mut(resource) {
            Some(current) if token < *current => Err(Error::Fenced {
                presented: token,
                highest: *current,
            }),
            Some(current) => {
                *current = token;
                Ok(())
            }
            None => {
                highest.insert(resource.to_owned(), token);
                Ok(())
            }
        }
    }

    /// The highest token admitted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<FencingToken> {
        self.highest.lock().get(resource).copied()
    }
}

/// A fence kept by a store: the same compare-and-reject as [`Fence`], shared by every
/// process that reaches the store (SQL backends keep it in a table).
///
/// The CLI's `tenure fence` and the demo admit tokens through this trait, whatever the
/// backend.
#[async_trait::async_trait]
pub trait FenceStore: Send + Sync + 'static {
    /// Admits `token` for `resource` if it is at least the highest admitted so far, and
    /// records it; otherwise returns [`Error::Fenced`].
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<()>;

    /// The highest token admitted for `resource`, if any.
    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>>;
}

#[async_trait::async_trait]
impl FenceStore for Fence {
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<()> {
        Fence::admit(self, resource, token)
    }

    async fn highest(&self, resource: &str) -> Result<Option<FencingToken>> {
        crate::lease::validate_name("resource", resource)?;
        Ok(Fence::highest(self, resource))
    }
}
