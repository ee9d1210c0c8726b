//! The token methods: create, list and revoke operator tokens.

use std::time::{Duration, SystemTime};

use hivekernel_proto::v1 as pb;
use tonic::Status;

use crate::caller::Scope;
use crate::events::unix_ms;
use crate::kernel::{Caller, Kernel, NewToken};
use crate::tokens::OperatorToken;

pub(super) async fn create(
    kernel: &Kernel,
    caller: Caller,
    req: pb::CreateTokenRequest,
) -> Result<pb::CreateTokenResponse, Status> {
    let scope = match pb::TokenScope::try_from(req.scope) {
        Ok(pb::TokenScope::Read) => Scope::Read,
        Ok(pb::TokenScope::Operate) => Scope::Operate,
        Ok(pb::TokenScope::Admin) => Scope::Admin,
        Ok(pb::TokenScope::Unspecified) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "scope must be TOKEN_SCOPE_READ, TOKEN_SCOPE_OPERATE or TOKEN_SCOPE_ADMIN, got {}",
                req.scope
            )));
        }
    };
    let new = NewToken {
        name: (!req.name.is_empty()).then_some(req.name),
        scope,
        expires_in: (req.expires_in_seconds > 0)
            .then(|| Duration::from_secs(req.expires_in_seconds)),
    };
    let (token, secret) = kernel.tokens().create(caller, new).await?;
    Ok(pb::CreateTokenResponse {
        token: Some(operator_token(&token)),
        secret,
    })
}

pub(super) fn list(
    kernel: &Kernel,
    caller: Caller,
    req: &pb::ListTokensRequest,
) -> Result<pb::ListTokensResponse, Status> {
    let tokens = kernel.tokens().list(caller, req.all)?;
    Ok(pb::ListTokensResponse {
        tokens: tokens.iter().map(operator_token).collect(),
    })
}

pub(super) async fn revoke(
    kernel: &Kernel,
    caller: Caller,
    which: &str,
) -> Result<pb::OperatorToken, Status> {
    if which.is_empty() {
        return Err(Status::invalid_argument(
            "token must name a token (its name or id)",
        ));
    }
    Ok(operator_token(
        &kernel.tokens().revoke(caller, which).await?,
    ))
}

fn operator_token(token: &OperatorToken) -> pb::OperatorToken {
    let scope = match token.scope {
        Scope::Read => pb::TokenScope::Read,
        Scope::Operate => pb::TokenScope::Operate,
        Scope::Admin => pb::TokenScope::Admin,
    };
    pb::OperatorToken {
        id: token.id,
        name: token.name.clone(),
        scope: scope.into(),
        created_at_unix_ms: token.created_ms,
        expires_at_unix_ms: token.expires_ms.unwrap_or(0),
        revoked_at_unix_ms: token.revoked_ms.unwrap_or(0),
        status: token.status(unix_ms(SystemTime::now())).to_owned(),
    }
}
