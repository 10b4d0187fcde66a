//! `tenure run`'s flags checked before the store is opened, with messages that name the
//! flags (not the library's options) and say what would fit.

use std::time::Duration;

use crate::{output, run, run_shards, UsageError};

/// The shard-group flags, checked before the store is opened.
pub(crate) fn check_group_flags(
    args: &run::RunArgs,
    group: &str,
    shards: u32,
) -> Result<(), UsageError> {
    let node_id = args.node_id.clone().unwrap_or_else(|| "node".to_owned());
    let options = run_shards::options(args, group, shards, node_id);
    match options.validate() {
        Ok(()) => Ok(()),
        Err(tenure::Error::InvalidArgument { field, reason }) => {
            let flag = match field {
                "group" => "--group",
                "shards" => "--shards",
                "renew_interval" => "--renew-every",
                "retry_interval" => "--retry-every",
                "work_grace" => "--kill-after",
                other => other,
            };
            Err(UsageError(format!("{flag}: {reason}")))
        }
        Err(other) => Err(UsageError(other.to_string())),
    }
}

pub(crate) fn check_run_flags(args: &run::RunArgs) -> Result<(), UsageError> {
    let show = |d: Duration| output::human(d);
    // Names are checked here, before the store is opened, so a bad one creates nothing.
    let names = [
        ("--role", "role", Some(&args.role)),
        ("--owner", "owner", args.owner.as_ref()),
        ("--node-id", "node_id", args.node_id.as_ref()),
    ];
    for (flag, field, value) in names {
        let Some(value) = value else { continue };
        if let Err(tenure::Error::InvalidArgument { reason, .. }) =
            tenure::lease::validate_name(field, value)
        {
            return Err(UsageError(format!("{flag} {value:?} {reason}")));
        }
    }
    if let Err(tenure::Error::InvalidArgument { reason, .. }) =
        tenure::lease::validate_value("advertise", args.advertise.as_deref())
    {
        return Err(UsageError(format!("--advertise {reason}")));
    }
    if args.ttl.is_zero() {
        return Err(UsageError("--ttl must be greater than 0s".to_owned()));
    }
    if args.renew_every.is_some_and(|d| d.is_zero()) || args.retry_every.is_zero() {
        return Err(UsageError(
            "--renew-every and --retry-every must be greater than 0s".to_owned(),
        ));
    }
    if let Some(renew_every) = args.renew_every.filter(|d| *d >= args.ttl) {
        return Err(UsageError(format!(
            "--renew-every ({}) must be less than --ttl ({})",
            show(renew_every),
            show(args.ttl)
        )));
    }
    if let Some(label) = &args.owner {
        if let Err(tenure::Error::InvalidArgument { reason, .. }) =
            tenure::owner_id_with_label(label)
        {
            return Err(UsageError(format!("--owner {reason}")));
        }
    }
    // A derived --kill-after always fits; an explicit one must leave time to lead.
    let window = args.options().local_window();
    if let Some(kill_after) = args.kill_after.filter(|_| args.work_grace() >= window) {
        return Err(UsageError(format!(
            "--kill-after ({}) plus the kill margin ({}) must be less than --ttl less its \
             clock-drift allowance ({}): the command must be dead before the lease can expire",
            show(kill_after),
            show(args.work_grace() - kill_after),
            show(window)
        )));
    }
    // Defaults derived from --ttl always fit; explicit values may not.
    if let Err(tenure::Error::InvalidArgument { reason, .. }) = args.options().validate() {
        let given = |value: Option<Duration>, shown: Duration| match value {
            Some(_) => show(shown),
            None => format!("{} (derived from --ttl)", show(shown)),
        };
        return Err(UsageError(format!(
            "--ttl {}, --renew-every {} and --kill-after {} do not fit: {reason}; \
             the command must be stopped (--kill-after) before the lease can expire, \
             with time to renew before that",
            show(args.ttl),
            given(args.renew_every, args.renew_every()),
            given(args.kill_after, args.kill_after())
        )));
    }
    if args
        .command
        .first()
        .is_some_and(|program| program.is_empty())
    {
        return Err(UsageError("the command after -- is empty".to_owned()));
    }
    Ok(())
}
