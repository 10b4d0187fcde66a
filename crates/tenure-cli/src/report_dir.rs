//! `--report DIR` of `tenure chaos` and `tenure bench`: the directory is checked (and
//! created) before the run starts, so a bad path costs nothing.

use std::path::{Path, PathBuf};

use crate::UsageError;

/// Creates `dir` (and its parents) unless it is already a directory; a path that is a
/// file, or cannot be created, is a usage error naming `--report`.
pub fn prepare(dir: &Path) -> Result<PathBuf, UsageError> {
    if dir.as_os_str().is_empty() {
        return Err(UsageError(
            "--report needs a directory path, got an empty one".to_owned(),
        ));
    }
    if dir.exists() && !dir.is_dir() {
        return Err(UsageError(format!(
            "--report {}: exists and is not a directory; name a directory (it is created if missing)",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|error| {
        UsageError(format!(
            "--report {}: cannot create the directory: {error}",
            dir.display()
        ))
    })?;
    Ok(dir.to_path_buf())
}

/// Tells the user where the report went (stderr: stdout carries the report itself).
pub fn announce(dir: &Path, files: &[PathBuf]) {
    let names: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    eprintln!("report written to {}: {}", dir.display(), names.join(", "));
}
