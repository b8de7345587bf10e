//! A log writer for unit tests that check what the log says: what is written, kept to read.

use std::sync::{Arc, Mutex, MutexGuard};

/// Held by every unit test that sets a subscriber of its own: one at a time. A
/// callsite's interest is cached process-wide and rebuilt whenever any thread makes a
/// dispatcher, so a test's filter could be judged with another test's subscriber in
/// the count: `info_span!` then built a span the test's own filter refuses (3 and 4 of
/// 40 runs of the lib tests, never with the test alone).
pub(crate) fn one_subscriber_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The log's bytes; clones share them, so one goes to the subscriber's writer.
#[derive(Clone, Default)]
pub(crate) struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl LogBuf {
    /// What has been written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
