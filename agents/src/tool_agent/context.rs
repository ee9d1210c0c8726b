//! Fitting a conversation into the model's context window.
//!
//! A request is the system prompt, then the kept history (daemons only),
//! then the current turn. When the estimate passes the budget, [`fit`] drops
//! from the oldest end, in this order, until it fits:
//!
//! 1. whole exchanges of the history (an exchange starts at a user message,
//!    so a tool result is never separated from the call that asked for it);
//! 2. whole tool rounds of the current turn (an assistant message with its
//!    tool results), except the turn's input and its latest round;
//! 3. the text of the longest remaining messages, cut to what fits, with a
//!    note saying so.
//!
//! A note at the end of the system prompt tells the model something is
//! missing (in the system message itself: many chat templates refuse a
//! second one).

use crate::llm::{ChatMessage, ChatRole, estimate_tokens};

/// Smallest budget worth trying; below it a request cannot say anything useful.
pub(crate) const MIN_BUDGET_TOKENS: u64 = 256;

/// The messages of one request, no larger than `budget` tokens by estimate
/// (tool schemas are accounted by the caller in `budget`).
pub(crate) fn fit(
    system: &ChatMessage,
    history: &[ChatMessage],
    turn: &[ChatMessage],
    budget: u64,
) -> Vec<ChatMessage> {
    let budget = budget.max(MIN_BUDGET_TOKENS);
    let fixed = estimate_tokens(std::slice::from_ref(system));
    let size = |messages: &[ChatMessage]| estimate_tokens(messages);
    if fixed + size(history) + size(turn) <= budget {
        return assemble(system, None, history, turn);
    }

    // 1. Whole history exchanges, oldest first.
    let note_cost = 32;
    let mut start = 0;
    while start < history.len() && fixed + note_cost + size(&history[start..]) + size(turn) > budget
    {
        start = next_exchange(history, start);
    }
    let kept_history = &history[start..];
    let dropped_history = start;
    if fixed + note_cost + size(kept_history) + size(turn) <= budget {
        return assemble(system, Some(dropped_history), kept_history, turn);
    }

    // 2. Whole tool rounds of the current turn, keeping its input and latest round.
    let mut turn: Vec<ChatMessage> = turn.to_vec();
    let mut dropped = dropped_history;
    while fixed + note_cost + size(&turn) > budget {
        let rounds = round_starts(&turn);
        if rounds.len() < 2 {
            break;
        }
        let (from, to) = (rounds[0], rounds[1]);
        dropped += to - from;
        turn.drain(from..to);
    }
    if fixed + note_cost + size(&turn) <= budget {
        return assemble(system, Some(dropped), &[], &turn);
    }

    // 3. Cut the longest texts until it fits.
    let room = budget.saturating_sub(fixed + note_cost);
    cut_to(&mut turn, room);
    assemble(system, Some(dropped.max(1)), &[], &turn)
}

fn assemble(
    system: &ChatMessage,
    dropped: Option<usize>,
    history: &[ChatMessage],
    turn: &[ChatMessage],
) -> Vec<ChatMessage> {
    let mut messages = Vec::with_capacity(1 + history.len() + turn.len());
    let mut system = system.clone();
    if let Some(dropped) = dropped {
        system.content.push_str(&format!(
            "\n\n[Context note: {dropped} earlier messages were left out or shortened to fit \
             the context window.]"
        ));
    }
    messages.push(system);
    messages.extend_from_slice(history);
    messages.extend_from_slice(turn);
    messages
}

/// Index of the exchange after the one starting at `start` (or the end).
pub(crate) fn next_exchange(history: &[ChatMessage], start: usize) -> usize {
    history[start + 1..]
        .iter()
        .position(|m| m.role == ChatRole::User)
        .map_or(history.len(), |offset| start + 1 + offset)
}

/// Where each tool round of a turn starts (an assistant message after the input).
fn round_starts(turn: &[ChatMessage]) -> Vec<usize> {
    turn.iter()
        .enumerate()
        .skip(1)
        .filter(|(_, m)| m.role == ChatRole::Assistant)
        .map(|(i, _)| i)
        .collect()
}

/// Shortens the longest message texts until `messages` fit in `room` tokens.
fn cut_to(messages: &mut [ChatMessage], room: u64) {
    for _ in 0..messages.len() * 2 {
        let total = estimate_tokens(messages);
        if total <= room {
            return;
        }
        let Some(longest) = messages.iter_mut().max_by_key(|m| m.content.len()) else {
            return;
        };
        let before = longest.content.len();
        let max = before.saturating_sub(((total - room) * 4) as usize);
        longest.content = crate::text::cut(std::mem::take(&mut longest.content), max);
        if longest.content.len() >= before {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::llm::ToolCall;

    fn exchange(text: &str) -> Vec<ChatMessage> {
        vec![ChatMessage::user(text), ChatMessage::assistant(text)]
    }

    #[test]
    fn a_request_that_fits_is_left_alone() {
        let system = ChatMessage::system("s");
        let history = exchange("old");
        let turn = vec![ChatMessage::user("now")];
        let fitted = fit(&system, &history, &turn, 10_000);
        assert_eq!(fitted.len(), 4);
        assert_eq!(fitted[0], system);
        assert_eq!(fitted[3].content, "now");
    }

    #[test]
    fn oldest_history_goes_first_and_a_note_says_so() {
        let system = ChatMessage::system("s");
        let mut history = exchange(&"a".repeat(2000));
        history.extend(exchange("recent"));
        let turn = vec![ChatMessage::user("now")];
        let fitted = fit(&system, &history, &turn, 300);
        assert!(
            fitted[0].content.contains("2 earlier messages"),
            "{fitted:?}"
        );
        assert_eq!(
            fitted.iter().filter(|m| m.role == ChatRole::System).count(),
            1,
            "one system message: {fitted:?}"
        );
        assert_eq!(fitted[1].content, "recent");
        assert_eq!(fitted.last().unwrap().content, "now");
        assert!(estimate_tokens(&fitted) <= 300);
    }

    #[test]
    fn old_tool_rounds_go_before_the_input_and_latest_round() {
        let system = ChatMessage::system("s");
        let call = |id: &str| {
            ChatMessage::assistant("").with_tool_calls(vec![ToolCall::new(id, "read_file", "{}")])
        };
        let turn = vec![
            ChatMessage::user("input"),
            call("1"),
            ChatMessage::tool_result("1", "x".repeat(4000)),
            call("2"),
            ChatMessage::tool_result("2", "latest"),
        ];
        let fitted = fit(&system, &[], &turn, 400);
        let texts: Vec<&str> = fitted.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(texts[1], "input");
        assert_eq!(fitted[2].tool_calls[0].id, "2");
        assert_eq!(texts[3], "latest");
        assert_eq!(fitted.len(), 4);
    }

    #[test]
    fn a_single_huge_input_is_cut_to_fit() {
        let system = ChatMessage::system("s");
        let turn = vec![ChatMessage::user("é".repeat(50_000))];
        let fitted = fit(&system, &[], &turn, 1000);
        assert!(
            estimate_tokens(&fitted) <= 1000,
            "{}",
            estimate_tokens(&fitted)
        );
        assert!(fitted.last().unwrap().content.ends_with("bytes in all]"));
    }
}
