//! `logs`: a process's transcript as readable text or JSON lines, and for
//! an `exec` agent its log file too; `--follow` keeps printing until the
//! process exits or Ctrl-C.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use hivekernel_proto::v1::{
    GetProcessRequest, GetTranscriptRequest, ReadLogRequest, TranscriptEntry,
    WatchTranscriptRequest,
};
use serde_json::{Map, Value};
use tonic::Code;

use super::client::Session;
use super::{CliError, LogsArgs, output};
use crate::event::unix_ms;
use crate::transcript::EntryKind;

/// Prints the transcript, then (for an `exec` agent) its log file.
pub(super) async fn logs(args: LogsArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let pid = session.pid(&args.pid).await?;
    let since_unix_ms = args.since.map_or(0, |since| {
        unix_ms(SystemTime::now()).saturating_sub(since.as_millis() as u64)
    });
    // A reaped process is gone from the table; its kept transcript is not.
    let log_file = session
        .client
        .get_process(GetProcessRequest { pid })
        .await
        .ok()
        .map(|info| info.into_inner().log_path)
        .filter(|path| !path.is_empty());
    let mut printer = Printer::new(args.json);
    if args.follow {
        let request = WatchTranscriptRequest {
            pid,
            tail_turns: args.tail.unwrap_or(0),
            since_unix_ms,
            after_id: 0,
        };
        let mut stream = session
            .client
            .watch_transcript(request)
            .await
            .map_err(|status| session.error(status))?
            .into_inner();
        if let Some(path) = &log_file {
            output::print(&format!("==> {path} <==\n"))?;
        }
        let mut file = log_file.map(|_| LogFile::new(pid));
        let mut poll = tokio::time::interval(Duration::from_millis(250));
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        let mut catch_ctrl_c = true;
        loop {
            tokio::select! {
                caught = &mut ctrl_c, if catch_ctrl_c => match caught {
                    Ok(()) => return Ok(()),
                    Err(_) => catch_ctrl_c = false,
                },
                _ = poll.tick(), if file.is_some() => {
                    if let Some(file) = &mut file {
                        file.print_new(&mut session, CHUNKS_PER_TICK).await?;
                    }
                }
                next = stream.message() => match next.map_err(|status| session.error(status))? {
                    Some(entry) => output::print(&printer.entry(&entry))?,
                    None => break,
                },
            }
        }
        // The process has exited: what its log file got last.
        if let Some(file) = &mut file {
            file.print_new(&mut session, usize::MAX).await?;
        }
        return Ok(());
    }
    let mut request = GetTranscriptRequest {
        pid,
        tail_turns: args.tail.unwrap_or(0),
        since_unix_ms,
        ..GetTranscriptRequest::default()
    };
    let mut found = false;
    loop {
        let page = session
            .client
            .get_transcript(request.clone())
            .await
            .map_err(|status| session.error(status))?
            .into_inner();
        found |= !page.entries.is_empty();
        let mut text = String::new();
        for entry in &page.entries {
            text.push_str(&printer.entry(entry));
        }
        output::print(&text)?;
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    if let Some(path) = log_file {
        output::print(&format!("==> {path} <==\n"))?;
        LogFile::new(pid)
            .print_new(&mut session, usize::MAX)
            .await?;
    } else if !found && !args.json {
        eprintln!("process {pid} has recorded no turns yet");
    }
    Ok(())
}

/// Bytes of an `exec` agent's log one read asks for.
const LOG_CHUNK: u64 = 64 << 10;
/// Reads of a log file a follow makes per tick at most (1 MiB), so a log
/// growing fast never holds up the transcript or Ctrl-C.
const CHUNKS_PER_TICK: usize = 16;

/// An `exec` agent's log file, read through the kernel (`ReadLog`) as it
/// grows: the kernel, or the node of a cluster holding the process, may
/// be on another machine.
struct LogFile {
    pid: u64,
    read: u64,
}

impl LogFile {
    fn new(pid: u64) -> Self {
        LogFile { pid, read: 0 }
    }

    /// Prints what was written since the last read (from the start again
    /// when the log was rotated meanwhile), a chunk at a time, in at most
    /// `most` reads. A process gone (collected) or out of reach for now
    /// (its node not answering) has nothing more to show now.
    async fn print_new(&mut self, session: &mut Session, most: usize) -> Result<(), CliError> {
        for _ in 0..most {
            let request = ReadLogRequest {
                pid: self.pid,
                offset: self.read,
                tail: false,
                max_bytes: LOG_CHUNK,
            };
            let chunk = match session.client.read_log(request).await {
                Ok(chunk) => chunk.into_inner(),
                Err(status) if matches!(status.code(), Code::NotFound | Code::Unavailable) => {
                    return Ok(());
                }
                Err(status) => return Err(session.error(status)),
            };
            let read = chunk.size.saturating_sub(chunk.offset);
            self.read = chunk.size;
            output::print(&chunk.text)?;
            // Caught up with the writer.
            if read < LOG_CHUNK {
                break;
            }
        }
        Ok(())
    }
}

/// Renders entries one after another, remembering what earlier ones were,
/// so a request can name the messages it sent.
struct Printer {
    json: bool,
    turn: u64,
    /// What each printed entry was, for the requests that name them.
    seen: HashMap<u64, String>,
    /// The answer as it streamed in so far (printed as it came), until the
    /// entry after it; and whether the last text printed was reasoning.
    streaming: Option<(String, bool)>,
}

impl Printer {
    fn new(json: bool) -> Self {
        Printer {
            json,
            turn: 0,
            seen: HashMap::new(),
            streaming: None,
        }
    }

    /// One entry: a JSON line, or its text (a header first when a new turn starts).
    fn entry(&mut self, entry: &TranscriptEntry) -> String {
        if self.json {
            return output::line(&entry_json(entry).to_string());
        }
        let mut text = String::new();
        let mut kind = serde_json::from_str::<EntryKind>(&entry.detail);
        if let Ok(EntryKind::Partial {
            text: more,
            reasoning,
        }) = &kind
            && entry.turn == self.turn
        {
            return self.stream(entry, more, *reasoning);
        }
        let mut streamed_head = "";
        if let Some((streamed, was_reasoning)) = self.streaming.take() {
            // The streamed line ends with what had not streamed yet (the
            // last piece may not have gone out live); the answer is not
            // printed twice.
            if let Ok(EntryKind::Response { content, .. }) = &mut kind
                && let Some(rest) = content.strip_prefix(streamed.as_str())
            {
                if was_reasoning && !rest.is_empty() {
                    text.push_str("\n    ");
                }
                text.push_str(&rest.replace('\n', "\n    "));
                content.clear();
                streamed_head = " (its text streamed above)";
            }
            text.push('\n');
        }
        if entry.turn != self.turn {
            self.turn = entry.turn;
            let _ = write!(
                text,
                "--- turn {} of pid {} at {}",
                entry.turn,
                entry.pid,
                output::rfc3339_utc(entry.at_unix_ms)
            );
            if let Ok(EntryKind::Input { source, .. }) = &kind {
                let _ = write!(text, " ({})", source_text(source));
            }
            text.push('\n');
        }
        let time = output::rfc3339_utc(entry.at_unix_ms);
        let time = time.get(11..23).unwrap_or(&time);
        let Ok(kind) = kind else {
            // An entry type this build does not know: shown as it came.
            let _ = writeln!(text, "{time} {} {}", entry.r#type, entry.detail);
            return text;
        };
        if let EntryKind::Partial {
            text: more,
            reasoning,
        } = &kind
        {
            // The first of a new turn: its header is out.
            text.push_str(&self.stream(entry, more, *reasoning));
            return text;
        }
        let (head, body) = describe(&kind, &self.seen);
        let _ = writeln!(text, "{time} {head}{streamed_head}");
        for line in body.lines() {
            let _ = writeln!(text, "    {line}");
        }
        self.seen.insert(entry.id, short_name(&kind));
        text
    }

    /// Streamed answer text, printed as it comes (indented under a
    /// `streaming` line), with no newline after it: more may follow.
    fn stream(&mut self, entry: &TranscriptEntry, more: &str, reasoning: bool) -> String {
        let mut text = String::new();
        let indented = more.replace('\n', "\n    ");
        match &mut self.streaming {
            None => {
                let time = output::rfc3339_utc(entry.at_unix_ms);
                let time = time.get(11..23).unwrap_or(&time);
                let _ = write!(text, "{time} streaming the answer\n    ");
                if reasoning {
                    text.push_str("(reasoning) ");
                }
                self.streaming = Some((String::new(), reasoning));
            }
            Some((_, was)) if *was != reasoning => {
                text.push_str(if reasoning {
                    "\n    (reasoning) "
                } else {
                    "\n    "
                });
            }
            Some(_) => {}
        }
        if let Some((streamed, was)) = &mut self.streaming {
            if !reasoning {
                streamed.push_str(more);
            }
            *was = reasoning;
        }
        text.push_str(&indented);
        text
    }
}

/// `task 7 from pid 1`, `message 9 (message) from pid 3`.
fn source_text(source: &hivekernel_agents::InputSource) -> String {
    match source {
        hivekernel_agents::InputSource::Task { request_id, from } => {
            format!("task {} from pid {from}", request_id.0)
        }
        hivekernel_agents::InputSource::Message {
            message_id,
            from,
            kind,
        } => format!("{kind} {} from pid {from}", message_id.0),
    }
}

/// How a request names an earlier entry it sent.
fn short_name(kind: &EntryKind) -> String {
    match kind {
        EntryKind::Message { role, .. } => role.as_str().to_owned(),
        EntryKind::Input { .. } => "input".to_owned(),
        EntryKind::Response { .. } => "response".to_owned(),
        EntryKind::ToolResult { tool, .. } => format!("{tool} result"),
        other => other.name().to_owned(),
    }
}

/// An entry's first line and its text (indented under it).
fn describe(kind: &EntryKind, seen: &HashMap<u64, String>) -> (String, String) {
    match kind {
        EntryKind::Input { text, .. } => ("input".into(), text.clone()),
        EntryKind::Message { role, content, .. } => {
            (format!("sent {} message", role.as_str()), content.clone())
        }
        EntryKind::Request {
            model,
            messages,
            max_tokens,
            estimated_tokens,
        } => {
            let named: Vec<String> = messages
                .iter()
                .map(|id| match seen.get(id) {
                    Some(name) => format!("{name} #{id}"),
                    None => format!("#{id}"),
                })
                .collect();
            let mut head = format!(
                "request to {model}: {} messages [{}]",
                messages.len(),
                named.join(", ")
            );
            if let Some(estimated) = estimated_tokens {
                let _ = write!(head, ", about {estimated} tokens");
            }
            if let Some(max) = max_tokens {
                let _ = write!(head, ", max {max} tokens");
            }
            (head, String::new())
        }
        EntryKind::Response {
            content,
            tool_calls,
            finish_reason,
            reasoning,
            prompt_tokens,
            completion_tokens,
            duration_ms,
        } => {
            let mut head = format!(
                "response in {duration_ms} ms: {prompt_tokens} prompt + {completion_tokens} completion tokens"
            );
            if let Some(reason) = finish_reason {
                let _ = write!(head, ", finish {reason}");
            }
            let mut body = String::new();
            if let Some(reasoning) = reasoning {
                let _ = writeln!(body, "(reasoning) {}", reasoning.trim_end());
            }
            body.push_str(content);
            for call in tool_calls {
                if !body.is_empty() && !body.ends_with('\n') {
                    body.push('\n');
                }
                let _ = write!(body, "call {} {} ({})", call.name, call.arguments, call.id);
            }
            (head, body)
        }
        EntryKind::ModelError {
            error,
            duration_ms,
            partial,
        } => {
            let mut body = error.clone();
            if let Some(partial) = partial {
                let _ = write!(body, "\n(what had come of the answer) {partial}");
            }
            (format!("model error after {duration_ms} ms"), body)
        }
        // Printed as it streams (`Printer::stream`), never described.
        EntryKind::Partial { text, .. } => ("streamed".into(), text.clone()),
        EntryKind::ToolResult {
            call_id,
            tool,
            ok,
            output,
            duration_ms,
        } => (
            format!(
                "tool {tool} {} in {duration_ms} ms ({call_id})",
                if *ok { "ok" } else { "failed" }
            ),
            output.clone(),
        ),
        EntryKind::Answer { text } => ("answer".into(), text.clone()),
        EntryKind::Failed { error } => ("failed".into(), error.clone()),
    }
}

/// One JSON object: the detail's fields plus id, pid, turn, at_unix_ms and type (which win).
fn entry_json(entry: &TranscriptEntry) -> Value {
    let mut object = match serde_json::from_str::<Value>(&entry.detail) {
        Ok(Value::Object(fields)) => fields,
        _ => Map::from_iter([("detail".to_owned(), Value::from(entry.detail.clone()))]),
    };
    object.insert("id".to_owned(), entry.id.into());
    object.insert("pid".to_owned(), entry.pid.into());
    object.insert("turn".to_owned(), entry.turn.into());
    object.insert("at_unix_ms".to_owned(), entry.at_unix_ms.into());
    object.insert("type".to_owned(), entry.r#type.clone().into());
    if !entry.trace_id.is_empty() {
        object.insert("trace_id".to_owned(), entry.trace_id.clone().into());
    }
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, turn: u64, kind: &EntryKind) -> TranscriptEntry {
        TranscriptEntry {
            id,
            pid: 5,
            turn,
            at_unix_ms: 1_700_000_000_000 + id,
            r#type: kind.name().to_owned(),
            detail: serde_json::to_string(kind).unwrap_or_default(),
            trace_id: String::new(),
        }
    }

    #[test]
    fn a_turn_reads_as_who_said_what() {
        use hivekernel_agents::llm::{ChatRole, ToolCall};
        use hivekernel_agents::{InputSource, Pid, RequestId};
        let kinds = [
            EntryKind::Input {
                source: InputSource::Task {
                    request_id: RequestId(7),
                    from: Pid(1),
                },
                text: "add 2 and 2".into(),
            },
            EntryKind::Message {
                role: ChatRole::System,
                content: "You add.".into(),
                tool_calls: vec![],
                tool_call_id: None,
            },
            EntryKind::Request {
                model: "m".into(),
                messages: vec![12, 11],
                max_tokens: Some(64),
                estimated_tokens: Some(25),
            },
            EntryKind::Response {
                content: String::new(),
                tool_calls: vec![ToolCall::new("c1", "calc", r#"{"a":2}"#)],
                finish_reason: Some("tool_calls".into()),
                reasoning: None,
                prompt_tokens: 30,
                completion_tokens: 5,
                duration_ms: 4,
            },
            EntryKind::ToolResult {
                call_id: "c1".into(),
                tool: "calc".into(),
                ok: true,
                output: "4\nexactly".into(),
                duration_ms: 1,
            },
            EntryKind::Answer { text: "4".into() },
        ];
        let mut printer = Printer::new(false);
        let text: String = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| printer.entry(&entry(11 + i as u64, 10, kind)))
            .collect();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "--- turn 10 of pid 5 at 2023-11-14T22:13:20.011Z (task 7 from pid 1)"
        );
        assert_eq!(lines[1], "22:13:20.011 input");
        assert_eq!(lines[2], "    add 2 and 2");
        assert_eq!(
            lines[5],
            "22:13:20.013 request to m: 2 messages [system #12, input #11], about 25 tokens, max 64 tokens"
        );
        assert_eq!(
            lines[6],
            "22:13:20.014 response in 4 ms: 30 prompt + 5 completion tokens, finish tool_calls"
        );
        assert_eq!(lines[7], r#"    call calc {"a":2} (c1)"#);
        assert_eq!(lines[8], "22:13:20.015 tool calc ok in 1 ms (c1)");
        assert_eq!(&lines[9..11], ["    4", "    exactly"]);
        assert_eq!(&lines[11..], ["22:13:20.016 answer", "    4"]);

        let mut json = Printer::new(true);
        let line = json.entry(&entry(16, 10, &kinds[5]));
        let value: Value = serde_json::from_str(&line).unwrap_or_default();
        assert_eq!(value["type"], "answer");
        assert_eq!(value["text"], "4");
        assert_eq!(value["turn"], 10);
    }

    #[test]
    fn a_streamed_answer_prints_as_it_comes_and_once() {
        let partial = |text: &str, reasoning| EntryKind::Partial {
            text: text.into(),
            reasoning,
        };
        let response = |content: &str| EntryKind::Response {
            content: content.into(),
            tool_calls: vec![],
            finish_reason: Some("stop".into()),
            reasoning: None,
            prompt_tokens: 9,
            completion_tokens: 4,
            duration_ms: 700,
        };
        let mut printer = Printer::new(false);
        printer.turn = 3;
        let mut out = Vec::new();
        for (id, kind) in [
            partial("hmm", true),
            partial("Two ", false),
            partial("lines\nhere", false),
            response("Two lines\nhere"),
            EntryKind::Answer {
                text: "Two lines\nhere".into(),
            },
        ]
        .iter()
        .enumerate()
        {
            out.push(printer.entry(&entry(20 + id as u64, 3, kind)));
        }
        // Each piece goes out as it comes, with no newline: more may follow.
        assert_eq!(
            out[0],
            "22:13:20.020 streaming the answer\n    (reasoning) hmm"
        );
        assert_eq!(out[1], "\n    Two ");
        assert_eq!(out[2], "lines\n    here");
        let text = out.concat();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[4],
            "22:13:20.023 response in 700 ms: 9 prompt + 4 completion tokens, finish stop (its text streamed above)"
        );
        assert_eq!(
            &lines[5..],
            ["22:13:20.024 answer", "    Two lines", "    here"]
        );

        // The last piece had not gone out live: it ends the streamed line.
        let mut printer = Printer::new(false);
        printer.turn = 3;
        printer.entry(&entry(40, 3, &partial("Two ", false)));
        let text = printer.entry(&entry(41, 3, &response("Two lines\nhere")));
        assert!(
            text.starts_with("lines\n    here\n22:13:20.041 response in 700 ms"),
            "{text}"
        );
        assert!(text.ends_with("(its text streamed above)\n"), "{text}");

        // An answer that differs from what streamed (a retry) is printed whole.
        let mut printer = Printer::new(false);
        printer.turn = 3;
        printer.entry(&entry(30, 3, &partial("lost", false)));
        let text = printer.entry(&entry(31, 3, &response("fresh")));
        assert!(text.starts_with("\n22:13:20.031 response in"), "{text}");
        assert!(text.ends_with("stop\n    fresh\n"), "{text}");
    }
}
