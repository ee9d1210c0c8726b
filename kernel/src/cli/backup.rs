//! `hivekernel backup DEST` and `hivekernel restore SRC`: copies of the
//! store, made and put back without the control plane (the files are
//! local; a backup needs no token and works whether a kernel runs or not).

use std::path::{Path, PathBuf};

use serde_json::json;

use super::human::bytes;
use super::{CliError, DataDirArgs, output};
use crate::store::DB_FILE;
use crate::store::backup::{self, BackupError, Copied};

/// Copies `<data_dir>/hivekernel.db` to the new file `dest`.
pub(super) async fn backup(dest: PathBuf, local: DataDirArgs) -> Result<(), CliError> {
    let DataDirArgs { data_dir, json } = local;
    let db = data_dir.join(DB_FILE);
    let copied = blocking(move || backup::backup(&db, &dest)).await?;
    if json {
        return output::print(&output::line(&copied_json(&copied, None).to_string()));
    }
    output::print(&output::line(&format!(
        "backed up {} to {} ({}, schema {}, {} ms)",
        data_dir.display(),
        copied.path.display(),
        bytes(copied.bytes),
        copied.schema,
        copied.elapsed.as_millis()
    )))
}

/// Puts a copy of `src` in place as `<data_dir>/hivekernel.db`, holding
/// the data directory's lock, so it is refused while a kernel runs there.
pub(super) async fn restore(src: PathBuf, local: DataDirArgs) -> Result<(), CliError> {
    let DataDirArgs { data_dir, json } = local;
    let dir = data_dir.clone();
    let restored = blocking(move || {
        create_dir(&dir)?;
        let _lock = crate::daemon::lock_data_dir(&dir).map_err(|err| match err {
            crate::daemon::StartError::Usage(message) => Held(message),
            other => Held(other.to_string()),
        })?;
        Ok::<_, Held>(backup::restore(&src, &dir.join(DB_FILE))?)
    })
    .await?;
    if json {
        let previous = restored.previous.as_deref();
        return output::print(&output::line(
            &copied_json(&restored.copied, Some(previous)).to_string(),
        ));
    }
    let mut text = format!(
        "restored {} ({}, schema {}); start the kernel on it with --data-dir {}",
        restored.copied.path.display(),
        bytes(restored.copied.bytes),
        restored.copied.schema,
        data_dir.display()
    );
    if let Some(previous) = &restored.previous {
        text.push_str(&format!(
            "\nthe store it replaced is kept as {}",
            previous.display()
        ));
    }
    output::print(&output::line(&text))
}

/// Why a restore did not happen: the data directory is held, or the
/// copy was refused.
struct Held(String);

impl From<BackupError> for Held {
    fn from(err: BackupError) -> Held {
        Held(err.to_string())
    }
}

impl From<Held> for CliError {
    fn from(Held(message): Held) -> CliError {
        CliError::Refused(message)
    }
}

impl From<BackupError> for CliError {
    fn from(err: BackupError) -> CliError {
        CliError::Refused(err.to_string())
    }
}

/// Runs file and SQLite work off the async threads.
async fn blocking<T, E>(work: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, CliError>
where
    T: Send + 'static,
    E: Into<CliError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(Into::into),
        Err(err) => Err(CliError::Refused(format!("the copy did not finish: {err}"))),
    }
}

/// Creates a missing data directory as the kernel would (mode 0700).
fn create_dir(dir: &Path) -> Result<(), Held> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|err| Held(format!("cannot create {}: {err}", dir.display())))
}

fn copied_json(copied: &Copied, previous: Option<Option<&Path>>) -> serde_json::Value {
    let mut value = json!({
        "path": copied.path,
        "bytes": copied.bytes,
        "schema": copied.schema,
        "elapsed_ms": copied.elapsed.as_millis() as u64,
    });
    if let Some(previous) = previous {
        value["previous"] = json!(previous);
    }
    value
}
