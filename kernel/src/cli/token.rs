//! `token create`, `token ls` and `token revoke`.

use std::io::IsTerminal;

use hivekernel_proto::v1::{
    CreateTokenRequest, ListTokensRequest, OperatorToken, RevokeTokenRequest, TokenScope,
};
use serde_json::{Value, json};

use super::client::Session;
use super::{CliError, TokenCommand, human, output};
use crate::caller::Scope;

/// Runs one `token` subcommand.
pub(super) async fn run(command: TokenCommand) -> Result<(), CliError> {
    match command {
        TokenCommand::Create {
            scope,
            name,
            expires,
            json,
            client,
        } => {
            let mut session = Session::connect(&client).await?;
            let request = CreateTokenRequest {
                name: name.unwrap_or_default(),
                scope: scope_pb(scope).into(),
                expires_in_seconds: expires.map_or(0, |d| d.as_secs().max(1)),
            };
            let created = session
                .client
                .create_token(request)
                .await
                .map_err(|status| session.error(status))?
                .into_inner();
            let token = created.token.unwrap_or_default();
            if json {
                let mut record = token_json(&token);
                record["token"] = Value::String(created.secret);
                return output::print(&output::line(&record.to_string()));
            }
            // The token alone on stdout, so `$(hivekernel token create ...)` is it.
            if std::io::stderr().is_terminal() {
                eprintln!(
                    "token {} ({}, scope {}, {}): shown once, keep it now",
                    token.id,
                    token.name,
                    scope_name(token.scope),
                    expiry(&token, human::now_ms()),
                );
            }
            output::print(&output::line(&created.secret))
        }
        TokenCommand::Ls { all, json, client } => {
            let mut session = Session::connect(&client).await?;
            let tokens = session
                .client
                .list_tokens(ListTokensRequest { all })
                .await
                .map_err(|status| session.error(status))?
                .into_inner()
                .tokens;
            if json {
                let all: Vec<Value> = tokens.iter().map(token_json).collect();
                output::print(&output::line(&Value::Array(all).to_string()))
            } else {
                output::print(&table(&tokens))
            }
        }
        TokenCommand::Revoke {
            token,
            json,
            client,
        } => {
            let mut session = Session::connect(&client).await?;
            let revoked = session
                .client
                .revoke_token(RevokeTokenRequest { token })
                .await
                .map_err(|status| session.error(status))?
                .into_inner();
            if json {
                output::print(&output::line(&token_json(&revoked).to_string()))
            } else {
                output::print(&output::line(&format!(
                    "revoked token {} ({})",
                    revoked.id, revoked.name
                )))
            }
        }
    }
}

fn scope_pb(scope: Scope) -> TokenScope {
    match scope {
        Scope::Read => TokenScope::Read,
        Scope::Operate => TokenScope::Operate,
        Scope::Admin => TokenScope::Admin,
    }
}

fn scope_name(scope: i32) -> &'static str {
    match TokenScope::try_from(scope) {
        Ok(TokenScope::Read) => "read",
        Ok(TokenScope::Operate) => "operate",
        Ok(TokenScope::Admin) => "admin",
        _ => "?",
    }
}

/// `expires in 29d23h`, `expired 2h ago`, `never expires`.
fn expiry(token: &OperatorToken, now: u64) -> String {
    match token.expires_at_unix_ms {
        0 => "never expires".to_owned(),
        at if at > now => format!("expires in {}", human::duration(at - now)),
        at => format!("expired {} ago", human::age(at, now)),
    }
}

/// ID NAME SCOPE CREATED EXPIRES STATUS, one line per token.
fn table(tokens: &[OperatorToken]) -> String {
    let now = human::now_ms();
    let mut rows = vec![["ID", "NAME", "SCOPE", "CREATED", "EXPIRES", "STATUS"].map(str::to_owned)];
    for token in tokens {
        let expires = match token.expires_at_unix_ms {
            0 => "never".to_owned(),
            at if at > now => format!("in {}", human::duration(at - now)),
            at => format!("{} ago", human::age(at, now)),
        };
        rows.push([
            token.id.to_string(),
            token.name.clone(),
            scope_name(token.scope).to_owned(),
            format!("{} ago", human::age(token.created_at_unix_ms, now)),
            expires,
            token.status.clone(),
        ]);
    }
    output::aligned(&rows)
}

fn token_json(token: &OperatorToken) -> Value {
    let some = |ms: u64| (ms != 0).then_some(ms);
    json!({
        "id": token.id,
        "name": token.name,
        "scope": scope_name(token.scope),
        "created_at_unix_ms": token.created_at_unix_ms,
        "expires_at_unix_ms": some(token.expires_at_unix_ms),
        "revoked_at_unix_ms": some(token.revoked_at_unix_ms),
        "status": token.status,
    })
}
