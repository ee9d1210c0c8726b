//! `artifacts ls`, `put`, `get` and `rm`, and how listings are rendered.

use std::io::{self, Read, Write};

use hivekernel_proto::v1::{
    ArtifactInfo, DeleteArtifactRequest, GetArtifactRequest, ListArtifactsRequest,
    StoreArtifactRequest, Visibility as PbVisibility,
};
use serde_json::{Value, json};

use super::client::Session;
use super::{
    ArtifactsGetArgs, ArtifactsLsArgs, ArtifactsPutArgs, ArtifactsRmArgs, CliError, human, names,
    output,
};

/// Lists the artifacts the admin sees, newest first.
pub(super) async fn ls(args: ArtifactsLsArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let request = ListArtifactsRequest {
        owner: session.pid_or_zero(args.owner.as_ref()).await?,
        limit: 0,
    };
    let listed = session
        .client
        .list_artifacts(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner()
        .artifacts;
    let text = if args.json {
        let all = listed.iter().map(artifact_json).collect();
        format!("{:#}\n", Value::Array(all))
    } else {
        table(&listed)
    };
    output::print(&text)
}

/// Stores a file (or stdin) as an artifact and prints its id.
pub(super) async fn put(args: ArtifactsPutArgs) -> Result<(), CliError> {
    // Local input first: an unreadable file is a usage error even with no kernel.
    let content = if args.file.as_os_str() == "-" {
        let mut buffer = Vec::new();
        io::stdin()
            .lock()
            .read_to_end(&mut buffer)
            .map_err(|err| CliError::Usage(format!("cannot read stdin: {err}")))?;
        buffer
    } else {
        std::fs::read(&args.file)
            .map_err(|err| CliError::Usage(format!("cannot read {}: {err}", args.file.display())))?
    };
    let request = StoreArtifactRequest {
        name: args.name,
        content,
        content_type: args.content_type.unwrap_or_default(),
        visibility: args
            .visibility
            .map_or(PbVisibility::Unspecified, names::visibility_to_proto)
            as i32,
        owner: 0,
    };
    let mut session = Session::connect(&args.client).await?;
    let request = StoreArtifactRequest {
        owner: session.pid_or_zero(args.owner.as_ref()).await?,
        ..request
    };
    let info = session
        .client
        .store_artifact(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    output::print(&output::line(&info.id.to_string()))
}

/// Writes an artifact's bytes, unchanged, to stdout or `-o FILE`.
pub(super) async fn get(args: ArtifactsGetArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let artifact = session
        .client
        .get_artifact(GetArtifactRequest { id: args.id })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    match &args.output {
        Some(path) => std::fs::write(path, &artifact.content)
            .map_err(|err| CliError::Usage(format!("cannot write {}: {err}", path.display()))),
        None => {
            let mut out = io::stdout().lock();
            out.write_all(&artifact.content)?;
            out.flush()?;
            Ok(())
        }
    }
}

/// Deletes an artifact; prints nothing.
pub(super) async fn rm(args: ArtifactsRmArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    session
        .client
        .delete_artifact(DeleteArtifactRequest { id: args.id })
        .await
        .map_err(|status| session.error(status))?;
    Ok(())
}

/// An aligned table: ID OWNER NAME TYPE VISIBILITY SIZE UPDATED (UTC).
fn table(artifacts: &[ArtifactInfo]) -> String {
    const HEADER: [&str; 7] = [
        "ID",
        "OWNER",
        "NAME",
        "TYPE",
        "VISIBILITY",
        "SIZE",
        "UPDATED",
    ];
    let mut rows = vec![HEADER.map(str::to_owned)];
    rows.extend(artifacts.iter().map(|a| {
        [
            a.id.to_string(),
            format!("{} ({})", a.owner, a.owner_name),
            a.name.clone(),
            a.content_type.clone(),
            names::visibility(a.visibility).to_owned(),
            human::bytes(a.size),
            output::rfc3339_utc(a.updated_at_unix_ms),
        ]
    }));
    output::aligned(&rows)
}

/// One artifact's description as JSON, with the lowercase visibility name.
fn artifact_json(a: &ArtifactInfo) -> Value {
    json!({
        "id": a.id,
        "name": a.name,
        "owner": a.owner,
        "owner_name": a.owner_name,
        "content_type": a.content_type,
        "visibility": names::visibility(a.visibility),
        "size": a.size,
        "created_at_unix_ms": a.created_at_unix_ms,
        "updated_at_unix_ms": a.updated_at_unix_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_render_as_a_table_and_as_json() {
        let info = ArtifactInfo {
            id: 7,
            name: "report.md".into(),
            owner: 2,
            owner_name: "queen".into(),
            content_type: "text/markdown".into(),
            visibility: PbVisibility::Subtree as i32,
            size: 42,
            created_at_unix_ms: 0,
            updated_at_unix_ms: 1_000,
        };
        let text = table(std::slice::from_ref(&info));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "ID",
                "OWNER",
                "NAME",
                "TYPE",
                "VISIBILITY",
                "SIZE",
                "UPDATED"
            ]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "7",
                "2",
                "(queen)",
                "report.md",
                "text/markdown",
                "subtree",
                "42",
                "B",
                "1970-01-01T00:00:01.000Z"
            ]
        );
        let value = artifact_json(&info);
        assert_eq!(value["visibility"], "subtree");
        assert_eq!(value["owner_name"], "queen");
    }
}
