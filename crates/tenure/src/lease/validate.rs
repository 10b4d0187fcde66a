//! The contract's input rules, in one place, so every backend rejects the same bad
//! input with the same message; and the fencing token's conversions to and from the
//! signed integers SQL stores keep.

use std::time::{Duration, SystemTime};

#[cfg(doc)]
use super::LeaseStore;
use super::{MAX_NAME_LEN, MAX_VALUE_LEN};
use crate::{Error, FencingToken, Result};

/// A token as the signed 64-bit integer SQL stores keep it in: above `i64::MAX` is
/// [`Error::InvalidArgument`] naming `field`. For backends.
pub fn token_to_i64(field: &'static str, backend: &str, token: FencingToken) -> Result<i64> {
    i64::try_from(token.get()).map_err(|_| {
        Error::invalid(
            field,
            format!(
                "{token} is larger than the {backend} backend's largest token, {}",
                i64::MAX
            ),
        )
    })
}

/// A token read back from a signed 64-bit column; a negative one is a corrupt row
/// ([`Error::Store`]). For backends.
pub fn token_from_i64(backend: &'static str, value: i64) -> Result<FencingToken> {
    u64::try_from(value).map(FencingToken::from).map_err(|_| {
        Error::store_msg(
            backend,
            format!("corrupt fencing token {value} in the store"),
        )
    })
}

/// Checks a role, owner or node id: non-empty, at most [`MAX_NAME_LEN`] bytes, no NUL
/// and no control characters.
pub fn validate_name(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    validate_text(field, value, MAX_NAME_LEN)?;
    let has_control = if value.is_ascii() {
        value.bytes().any(|b| b.is_ascii_control())
    } else {
        value.chars().any(char::is_control)
    };
    if has_control {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// Checks a term's advertised value: at most [`MAX_VALUE_LEN`] bytes, no NUL byte (SQL
/// text cannot hold one). `field` names it in the error.
pub fn validate_value(field: &'static str, value: Option<&str>) -> Result<()> {
    value.map_or(Ok(()), |value| validate_text(field, value, MAX_VALUE_LEN))
}

/// The rules names and values share: at most `max` bytes, and no NUL byte (SQL text
/// cannot hold one).
fn validate_text(field: &'static str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("is {} bytes long, at most {max} allowed", value.len()),
        ));
    }
    if value.as_bytes().contains(&0) {
        return Err(Error::invalid(field, "must not contain a NUL byte"));
    }
    Ok(())
}

/// Checks a TTL: at least `min` (and so never zero), and `now + ttl` representable.
pub fn validate_ttl(ttl: Duration, min: Duration, now: SystemTime) -> Result<SystemTime> {
    if ttl.is_zero() {
        return Err(Error::invalid("ttl", "must be greater than zero"));
    }
    if ttl < min {
        return Err(Error::invalid(
            "ttl",
            format!("{ttl:?} is below the store's minimum of {min:?}"),
        ));
    }
    now.checked_add(ttl)
        .ok_or_else(|| Error::invalid("ttl", format!("{ttl:?} is too large: now + ttl overflows")))
}

/// Checks every role of a batch ([`LeaseStore::acquire_many_in_session`]) before
/// anything is written.
pub fn validate_roles(roles: &[String]) -> Result<()> {
    roles
        .iter()
        .try_for_each(|role| validate_name("role", role))
}

/// Checks the successor named to [`LeaseStore::hand_over`] (or a handoff), if any: a
/// name as [`validate_name`] rules, reported as `successor`.
pub fn validate_successor(successor: Option<&str>) -> Result<()> {
    successor.map_or(Ok(()), |successor| validate_name("successor", successor))
}

/// Checks the arguments of [`LeaseStore::release`].
pub fn validate_release(role: &str, owner: &str) -> Result<()> {
    validate_name("role", role)?;
    validate_name("owner", owner)
}
