//! The dashboard's HTTP handlers: the files, login and logout, and the
//! Kernel service's methods as JSON.
//!
//! - `POST /api/login` `{"token": "..."}`: `{scope, pid, version, node,
//!   csrf}` (`node`: this kernel's node name in a cluster, else empty;
//!   `csrf`: the session key, answered here only), and the cookie.
//! - `GET /api/session`: the same but the key, or 401.
//! - `POST /api/logout`: 204, the cookie cleared.
//! - `POST /api/rpc/<Method>`: the request message as JSON in, the answer
//!   out (`ListProcesses`, a stream that ends, as an array of its batches).
//! - `POST /api/ticket`: `{ticket, expiresInSeconds}`, a single-use ticket
//!   for one live stream.
//! - `GET /api/watch/<Method>?q=<request JSON>&ticket=<ticket>`: a live
//!   stream (`SubscribeEvents`, `WatchTranscript`, `WatchRequests`) as
//!   server-sent events, each `data:` a JSON array of the messages that
//!   were ready together (at most [`BATCH`]), closed by an `end` or
//!   `error` event.
//!
//! Every call but the login carries the session's cookie and proves it:
//! with the session key in `X-CSRF-Token`, or for a live stream with a
//! ticket ([`super::session`]).
//!
//! An error is `{"code": "<gRPC code>", "message": "..."}` with the HTTP
//! status the gRPC code maps to.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt as _, Stream};
use prost_reflect::MethodDescriptor;
use tonic::{Code, Status};

use super::Shared;
use super::session::{Active, LIFETIME, LoginError, NoSession, TICKET_LIFETIME};
use crate::caller::Caller;
use crate::grpc::{Answer, code_name};

/// The header that carries the session key.
const CSRF_HEADER: &str = "x-csrf-token";
/// Streams that end, which a POST may read whole.
const ENDING_STREAMS: [&str; 1] = ["ListProcesses"];
/// Live streams a page may watch.
const WATCHED: [&str; 3] = ["SubscribeEvents", "WatchTranscript", "WatchRequests"];
/// Bytes of JSON a POST of an ending stream answers with at most.
const MAX_COLLECTED: usize = 256 << 20;
/// How often an idle live stream sends a comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Messages of a live stream sent in one event at most: a busy stream is
/// written a batch at a time rather than a write per message.
const BATCH: usize = 256;

/// A refusal, as the page reads it.
struct Refusal(Status);

impl From<Status> for Refusal {
    fn from(status: Status) -> Self {
        Refusal(status)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (
            http_status(self.0.code()),
            [(header::CONTENT_TYPE, "application/json")],
            error_body(&self.0),
        )
            .into_response()
    }
}

/// `{"code": "<gRPC code>", "message": "..."}`: how a refusal reads, as an
/// answer or as a stream's last event.
fn error_body(status: &Status) -> String {
    serde_json::json!({
        "code": code_name(status.code() as i32),
        "message": status.message(),
    })
    .to_string()
}

/// The HTTP status a gRPC code is answered with (as gRPC gateways map them).
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub(super) async fn asset(state: Shared, uri: Uri, request: HeaderMap) -> Response {
    let found = super::assets::ASSETS
        .iter()
        .zip(&state.etags)
        .find(|(asset, _)| asset.path == uri.path());
    match found {
        Some((asset, etag)) => asset.serve(etag.clone(), &request),
        None => not_found().await,
    }
}

pub(super) async fn not_found() -> Response {
    Refusal(Status::not_found(
        "not found: the dashboard serves /, /assets/ and /api/",
    ))
    .into_response()
}

/// The session the request's cookie names, proven by the session key in
/// its header.
fn active(state: &Shared, headers: &HeaderMap) -> Result<(String, Active), Refusal> {
    let id = session_id(state, headers)?;
    let key = headers
        .get(CSRF_HEADER)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let active = state.sessions.get(&id, key).map_err(refused)?;
    Ok((id, active))
}

/// The session id in the request's cookie.
fn session_id(state: &Shared, headers: &HeaderMap) -> Result<String, Refusal> {
    cookie(headers, &state.cookie).ok_or_else(|| Refusal(Status::unauthenticated("not logged in")))
}

fn refused(why: NoSession) -> Refusal {
    Refusal(Status::unauthenticated(match why {
        NoSession::Missing => "the session has ended: log in again".to_owned(),
        NoSession::Unproven(why) => why.to_owned(),
        NoSession::Refused(why) => why,
    }))
}

/// The session of a POST: its body JSON, its origin (when given) this
/// one, its session key in the header.
fn acting(state: &Shared, headers: &HeaderMap) -> Result<(String, Active), Refusal> {
    check_post(headers)?;
    active(state, headers)
}

/// A POST must be JSON, which a cross-site form cannot send (where it
/// comes from is checked before: [`super::origin`]).
fn check_post(headers: &HeaderMap) -> Result<(), Refusal> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(';')
                .next()
                .is_some_and(|kind| kind.trim().eq_ignore_ascii_case("application/json"))
        });
    if !json {
        return Err(Status::invalid_argument("send the body as application/json").into());
    }
    Ok(())
}

/// A request refused for where it comes from.
pub(super) fn forbidden(why: String) -> Response {
    Refusal(Status::permission_denied(why)).into_response()
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

fn set_cookie(state: &Shared, value: &str, max_age: u64) -> HeaderValue {
    let secure = if state.secure { "; Secure" } else { "" };
    let cookie = format!(
        "{}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
        state.cookie
    );
    HeaderValue::from_str(&cookie).unwrap_or(HeaderValue::from_static(""))
}

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// What the page is told about its session, on the dashboard of `node`
/// (a cluster's node, else `None`).
fn described(active: &Active, node: Option<&str>) -> serde_json::Value {
    let pid = match active.caller {
        Caller::Process(pid) => pid.0,
        _ => 0,
    };
    serde_json::json!({
        "scope": active.caller.scope().as_str(),
        "pid": pid,
        "version": env!("CARGO_PKG_VERSION"),
        "node": node.unwrap_or_default(),
    })
}

pub(super) async fn session(state: Shared, headers: HeaderMap) -> Response {
    match active(&state, &headers) {
        Ok((_, active)) => json_response(
            described(&active, state.node.as_deref())
                .to_string()
                .into_bytes(),
        ),
        Err(refusal) => refusal.into_response(),
    }
}

pub(super) async fn login(state: Shared, headers: HeaderMap, body: Bytes) -> Response {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Login {
        token: String,
    }
    if let Err(refusal) = check_post(&headers) {
        return refusal.into_response();
    }
    let login: Login = match serde_json::from_slice(&body) {
        Ok(login) => login,
        Err(err) => {
            return Refusal(Status::invalid_argument(format!(
                "the body must be {{\"token\": \"...\"}}: {err}"
            )))
            .into_response();
        }
    };
    match state.sessions.login(&login.token) {
        Ok(session) => {
            tracing::info!(caller = %session.active.caller.who(), "dashboard: logged in");
            let mut described = described(&session.active, state.node.as_deref());
            described["csrf"] = serde_json::Value::String(session.key);
            let mut response = json_response(described.to_string().into_bytes());
            response.headers_mut().insert(
                header::SET_COOKIE,
                set_cookie(&state, &session.id, LIFETIME.as_secs()),
            );
            response
        }
        Err(LoginError::Refused(why)) => Refusal(Status::unauthenticated(why)).into_response(),
        Err(LoginError::Unavailable(why)) => {
            Refusal(Status::resource_exhausted(why)).into_response()
        }
    }
}

/// A ticket for one live stream of the session, good for a short while.
pub(super) async fn ticket(state: Shared, headers: HeaderMap) -> Response {
    let made = acting(&state, &headers).and_then(|(id, _)| {
        let key = headers
            .get(CSRF_HEADER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        state.sessions.ticket(&id, key).map_err(refused)
    });
    match made {
        Ok(ticket) => json_response(
            serde_json::json!({
                "ticket": ticket,
                "expiresInSeconds": TICKET_LIFETIME.as_secs(),
            })
            .to_string()
            .into_bytes(),
        ),
        Err(refusal) => refusal.into_response(),
    }
}

pub(super) async fn logout(state: Shared, headers: HeaderMap) -> Response {
    match acting(&state, &headers) {
        Ok((id, _)) => {
            state.sessions.logout(&id);
            let mut response = StatusCode::NO_CONTENT.into_response();
            response
                .headers_mut()
                .insert(header::SET_COOKIE, set_cookie(&state, "", 0));
            response
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// The method a page names, if it may call it this way.
fn method(state: &Shared, name: &str, watched: bool) -> Result<MethodDescriptor, Refusal> {
    let unknown = || {
        Refusal(Status::not_found(format!(
            "no method {} in hivekernel.v1.Kernel",
            hivekernel_agents::text::shown(name)
        )))
    };
    let method = state
        .schema
        .method(name)
        .map_err(|err| Refusal(Status::internal(err)))?
        .ok_or_else(unknown)?;
    let allowed = if watched {
        WATCHED.contains(&name)
    } else {
        !method.is_client_streaming()
            && (!method.is_server_streaming() || ENDING_STREAMS.contains(&name))
    };
    if !allowed {
        let how = if watched {
            format!("only {} are watched", WATCHED.join(", "))
        } else if method.is_server_streaming() {
            format!("{name} is a live stream: GET /api/watch/{name}")
        } else {
            format!("{name} is not served to pages")
        };
        return Err(Refusal(Status::invalid_argument(how)));
    }
    Ok(method)
}

pub(super) async fn rpc(
    state: Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match call(&state, &name, &headers, &body).await {
        Ok(body) => json_response(body),
        Err(refusal) => refusal.into_response(),
    }
}

async fn call(
    state: &Shared,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<u8>, Refusal> {
    let (_, active) = acting(state, headers)?;
    let method = method(state, name, false)?;
    let request = state
        .schema
        .request(&method, body)
        .map_err(Status::invalid_argument)?;
    let mut answer = state.service.call(active.caller, name, request).await?;
    if !method.is_server_streaming() {
        let message = answer
            .next()
            .await
            .unwrap_or_else(|| Err(Status::internal("the call answered nothing")))?;
        return state
            .schema
            .response(&method, message)
            .map_err(|err| Refusal(Status::internal(err)));
    }
    let mut out = b"[".to_vec();
    while let Some(message) = answer.next().await {
        let json = state
            .schema
            .response(&method, message?)
            .map_err(|err| Refusal(Status::internal(err)))?;
        if out.len() + json.len() > MAX_COLLECTED {
            return Err(Refusal(Status::resource_exhausted(
                "the answer is larger than 256 MiB: ask for less (root, maxDepth)",
            )));
        }
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(&json);
    }
    out.push(b']');
    Ok(out)
}

pub(super) async fn watch(
    state: Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let opened = async {
        let param = |name: &str| {
            uri.query()
                .and_then(|query| {
                    form_urlencoded::parse(query.as_bytes())
                        .find(|(key, _)| key == name)
                        .map(|(_, value)| value.into_owned())
                })
                .unwrap_or_default()
        };
        let id = session_id(&state, &headers)?;
        let active = state
            .sessions
            .redeem(&id, &param("ticket"))
            .map_err(refused)?;
        let method = method(&state, &name, true)?;
        let query = param("q");
        let request = state
            .schema
            .request(&method, query.as_bytes())
            .map_err(Status::invalid_argument)?;
        let answer = state.service.call(active.caller, &name, request).await?;
        Ok::<_, Refusal>(Source { answer, method })
    };
    match opened.await {
        Ok(source) => Sse::new(events(state, source))
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
            .into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// A live stream: the call's answer and what its messages are.
struct Source {
    answer: Answer,
    method: MethodDescriptor,
}

impl Source {
    /// The next message as JSON; `None` once the call ended well. Cancel
    /// safe: nothing is taken until a message is ready.
    async fn next(&mut self, state: &Shared) -> Option<Result<Vec<u8>, Status>> {
        let message = self.answer.next().await?;
        Some(message.and_then(|message| {
            state
                .schema
                .response(&self.method, message)
                .map_err(Status::internal)
        }))
    }
}

/// Where a live stream's events are.
enum Step {
    /// The call goes on.
    Reading(Source),
    /// The call has ended: this event says how.
    Closing(Event),
    Done,
}

/// A live stream's messages as events, each carrying the messages that
/// were ready together, then `end`, or `error` with the status that ended it.
fn events(state: Shared, source: Source) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(Step::Reading(source), move |step| {
        let state = state.clone();
        async move {
            let mut source = match step {
                Step::Reading(source) => source,
                Step::Closing(event) => return Some((Ok(event), Step::Done)),
                Step::Done => return None,
            };
            let mut batch = vec![b'['];
            let mut count = 0;
            let mut ended = None;
            while count < BATCH {
                // The first message is waited for; the rest only taken when ready.
                let next = if count == 0 {
                    source.next(&state).await
                } else {
                    match source.next(&state).now_or_never() {
                        Some(next) => next,
                        None => break,
                    }
                };
                match next {
                    Some(Ok(json)) => {
                        if count > 0 {
                            batch.push(b',');
                        }
                        batch.extend_from_slice(&json);
                        count += 1;
                    }
                    Some(Err(status)) => {
                        ended = Some(error_event(&status));
                        break;
                    }
                    None => {
                        ended = Some(Event::default().event("end").data("{}"));
                        break;
                    }
                }
            }
            batch.push(b']');
            let next = match ended {
                Some(event) if count == 0 => return Some((Ok(event), Step::Done)),
                Some(event) => Step::Closing(event),
                None => Step::Reading(source),
            };
            let data = String::from_utf8(batch)
                .unwrap_or_else(|invalid| String::from_utf8_lossy(invalid.as_bytes()).into_owned());
            Some((Ok(Event::default().data(data)), next))
        }
    })
}

fn error_event(status: &Status) -> Event {
    Event::default().event("error").data(error_body(status))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A header map of `pairs`, in order.
    pub(in crate::dashboard) fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (key, value) in pairs {
            map.append(*key, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let map = headers(&[
            ("cookie", "theme=dark; hivekernel-8=abc"),
            ("cookie", "hivekernel-80=def"),
        ]);
        assert_eq!(cookie(&map, "hivekernel-80").as_deref(), Some("def"));
        assert_eq!(cookie(&map, "hivekernel-8").as_deref(), Some("abc"));
        assert_eq!(cookie(&map, "hivekernel-9"), None);
        assert_eq!(
            cookie(&headers(&[("cookie", "hivekernel-9=")]), "hivekernel-9"),
            None
        );
    }

    #[test]
    fn a_post_must_be_json() {
        let json = ("content-type", "application/json; charset=utf-8");
        assert!(check_post(&headers(&[json])).is_ok());
        assert!(check_post(&headers(&[("content-type", "text/plain")])).is_err());
        assert!(check_post(&headers(&[])).is_err());
    }
}
