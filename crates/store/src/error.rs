//! The error every layer with I/O returns: a [`Rejection`] (the client's fault, with its
//! stable code), a database or pool failure, an unknown commit outcome, or anything
//! else that is the server's fault. The mapping to HTTP and GraphQL lives at the edge.

pub use agent_stream_core::error::{cap_message, ErrorCode, Rejection, MAX_MESSAGE};

/// Every error the library returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request was refused; nothing was written.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A database call failed.
    #[error("database: {}", pg_message(.0))]
    Db(#[from] tokio_postgres::Error),
    /// No pooled connection could be had.
    #[error("database pool: {}", pool_message(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The connection was lost after COMMIT was sent, and whether the transaction
    /// committed could not be checked either.
    #[error("commit outcome unknown: {0}")]
    InDoubt(String),
    /// Anything else that is the server's fault.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl Error {
    /// True when the database refused an event because its run already holds one at
    /// that seq: another process appended to the run after this writer read its head.
    /// Nothing of the transaction is stored; the append can be built again on the new
    /// head.
    pub fn is_seq_taken(&self) -> bool {
        let Error::Db(e) = self else { return false };
        let Some(d) =
            e.as_db_error().filter(|d| *d.code() == tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
        else {
            return false;
        };
        // On Citus the constraint is named after the shard (agent_run_events_pkey_102008),
        // and the coordinator passes on neither the constraint field nor (in another
        // lc_messages) words to match. A unique violation without a constraint name is
        // then taken for a taken seq: the only rows an append inserts are events, and its
        // other unique index, on idempotency keys, cannot be raced (appends with keys
        // lock the run's row first), so the worst case is a few rebuilds before the
        // error is reported.
        d.constraint().is_none_or(|c| c.starts_with("agent_run_events_pkey"))
    }

    /// Shorthand for a rejection with no event index.
    pub fn reject(code: ErrorCode, message: impl Into<String>) -> Self {
        Error::Rejected(Rejection::new(code, message))
    }

    /// What a client is told: the message and offending index for rejections, a
    /// generic message for server-side failures (whose cause is logged here instead).
    pub fn public_parts(&self) -> (String, Option<usize>) {
        match self {
            Error::Rejected(r) => (cap_message(&r.message), r.index),
            Error::InDoubt(_) => {
                tracing::warn!(error = %self, "commit outcome unknown");
                (
                    "the connection to the database was lost while committing, and whether the append \
                     was stored could not be checked; retry it with the same idempotency keys to find out"
                        .to_owned(),
                    None,
                )
            }
            _ if self.code() == ErrorCode::TextNul => {
                // Validation refuses NUL at the edge; reaching the database means a
                // check is missing somewhere, so say so in the log.
                tracing::warn!(error = %self, "a NUL character reached the database");
                (agent_stream_core::domain::text::nul_rejection("a string").message, None)
            }
            _ if self.code() == ErrorCode::Unavailable => {
                tracing::warn!(error = %self, "database unavailable");
                ("the database is unavailable; retry shortly".to_owned(), None)
            }
            _ => {
                tracing::error!(error = ?self, "internal error");
                ("internal error; the cause has been logged".to_owned(), None)
            }
        }
    }

    /// The code a client sees for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Rejected(r) => r.code,
            Error::Db(e) if is_unavailable(e) => ErrorCode::Unavailable,
            Error::Db(e) if is_nul(e) => ErrorCode::TextNul,
            Error::Pool(_) | Error::InDoubt(_) => ErrorCode::Unavailable,
            _ => ErrorCode::Internal,
        }
    }
}

/// True when a database error means "try again later" rather than a bug: the
/// connection is gone, the server is starting or shutting down, or it is overloaded.
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            // Class 08: connection exceptions; 57P: operator intervention (shutdown,
            // cannot connect now); 53: insufficient resources; 40001/40P01: retryable.
            c.starts_with("08") || c.starts_with("57P") || c.starts_with("53") || c == "40001" || c == "40P01"
        }
        // No SQLSTATE means the error came from the socket, not the server.
        None => true,
    }
}

/// A tokio-postgres error with its causes, which its `Display` leaves out ("error
/// performing TLS handshake" alone does not say that the certificate was refused).
pub fn pg_message(e: &tokio_postgres::Error) -> String {
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    if s.contains("UnknownIssuer") {
        // rustls's word for it; say what it means for the connection string.
        s.push_str(" (the server's certificate was not issued by a certificate authority in sslrootcert)");
    }
    s
}

fn pool_message(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => format!("could not open a connection: {}", pg_message(e)),
        other => other.to_string(),
    }
}

/// True when PostgreSQL refused a string for holding U+0000 (`text`: 22021;
/// `jsonb`: 22P05): the client's input, not a server fault.
fn is_nul(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| matches!(c.code(), "22021" | "22P05"))
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
