//! Run states and the one table of legal transitions between them.

use serde::{Deserialize, Serialize};

/// The lifecycle state of a run (or of a child scope inside a run's log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "graphql", derive(async_graphql::Enum))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Run accepted, plan being generated.
    Planning,
    /// Plan proposed, waiting for a user's decision.
    AwaitingApproval,
    /// Actively executing.
    Running,
    /// Paused by a user.
    Paused,
    /// A user issued a redirect.
    Redirecting,
    /// Completed successfully (terminal).
    Done,
    /// Cancelled (terminal).
    Aborted,
    /// Failed unrecoverably (terminal).
    Error,
}

impl RunState {
    /// Every state, in the brief's order.
    pub const ALL: [RunState; 8] = [
        RunState::Planning,
        RunState::AwaitingApproval,
        RunState::Running,
        RunState::Paused,
        RunState::Redirecting,
        RunState::Done,
        RunState::Aborted,
        RunState::Error,
    ];

    /// The wire and database form.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Planning => "planning",
            RunState::AwaitingApproval => "awaiting_approval",
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Redirecting => "redirecting",
            RunState::Done => "done",
            RunState::Aborted => "aborted",
            RunState::Error => "error",
        }
    }

    /// Parses the wire form.
    pub fn parse(s: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Done, aborted and error end a run: nothing may be appended after them.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunState::Done | RunState::Aborted | RunState::Error)
    }

    /// The states a run may move to from `from` (`None` = a new run with no lifecycle yet).
    pub fn successors(from: Option<RunState>) -> &'static [RunState] {
        use RunState::*;
        match from {
            None => &[Planning, Running],
            Some(Planning) => &[AwaitingApproval, Running, Aborted, Error],
            Some(AwaitingApproval) => &[Running, Planning, Aborted, Error],
            Some(Running) => &[Paused, Redirecting, AwaitingApproval, Done, Aborted, Error],
            Some(Paused) => &[Running, Aborted, Error],
            Some(Redirecting) => &[Running, Planning, Aborted, Error],
            Some(Done) | Some(Aborted) | Some(Error) => &[],
        }
    }

    /// True when the brief's transition table allows `from -> to`.
    pub fn can_move(from: Option<RunState>, to: RunState) -> bool {
        Self::successors(from).contains(&to)
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_have_no_successors() {
        for s in RunState::ALL {
            assert_eq!(s.is_terminal(), RunState::successors(Some(s)).is_empty(), "{s}");
        }
    }

    #[test]
    fn the_table_matches_the_brief() {
        use RunState::*;
        assert!(RunState::can_move(None, Planning));
        assert!(RunState::can_move(None, Running));
        assert!(!RunState::can_move(None, Done));
        assert!(RunState::can_move(Some(AwaitingApproval), Planning));
        assert!(!RunState::can_move(Some(Paused), Done));
        assert!(!RunState::can_move(Some(Running), Running));
        assert!(RunState::can_move(Some(Redirecting), Planning));
    }

    #[test]
    fn wire_form_round_trips() {
        for s in RunState::ALL {
            assert_eq!(RunState::parse(s.as_str()), Some(s));
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
    }
}
