//! Dialects: the same log and the same fold, spoken in each client's protocol.
//!
//! An [`Encoding`] owns the one [`RunView`] of a stream and a stateless [`Encoder`]. Each
//! event is folded once by the shared reducer; the encoder then renders the event from
//! the view and what the fold says it changed ([`Change`]), never folding anything
//! itself. Because an encoder keeps no state of its own, the view at a cursor is all a
//! resumed stream needs: SSE, replay, JSONL export and the `runEvents` subscription all
//! encode through here, from the start or from any cursor.
//!
//! # Resuming
//! One rule for every dialect: a client that disconnects after any item and resumes with
//! the last id it saw ends with exactly the state of a client that never disconnected.
//! Ids are [`Cursor`]s (a seq for most items). Two ways to keep that promise:
//!
//! - [`Resume::Exact`] (native, multica, chunks, hier, typed): the stream continues with
//!   the first item the client has not seen, nothing repeated ([`resume::Resumer`]).
//! - [`Resume::Resync`] (agui, vercel): the protocol has a way to re-synchronise a
//!   client, so a resumed stream is valid on its own: it opens like a new stream and
//!   brings the client to the state at the cursor ([`Encoder::open`]: AG-UI's
//!   `MESSAGES_SNAPSHOT`, the AI SDK's replay from `start`), then continues. What the
//!   client's protocol keeps through that is dropped as in an exact resume
//!   ([`Encoder::kept_through_resync`]).
//!
//! Each dialect's module doc states its rule, item by item.
//!
//! # Shaping
//! Deltas carry a [`Lane`] (the message, reasoning stream or child they extend);
//! [`shape::Shaper`] merges a lane's deltas into one frame per window (seed 004 R1),
//! whatever interleaves, and numbers frames so a resume stays exact.

mod agui;
mod chunks;
pub mod cursor;
mod hier;
mod multica;
mod native;
pub mod resume;
pub mod shape;
mod typed;
mod vercel;

use std::hash::{Hash, Hasher};

use serde_json::Value;

pub use cursor::Cursor;
use resume::Resumer;

use crate::domain::Event;
use crate::error::{ErrorCode, Rejection, Result};
use crate::projection::{Change, RunView};

/// A client protocol, chosen with `?format=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// agent-stream's own envelope (seed 004).
    #[default]
    Native,
    /// Seed 000's `StreamPayload` with full-snapshot `message_update`.
    Multica,
    /// Seed 001's `message.start` / `message.chunk` / `message.end`.
    Chunks,
    /// Seed 002's chunk / message / block / thread ids.
    Hier,
    /// Seed 003's typed events (`thought`, `tool_call`, …, `final`, `error`).
    Typed,
    /// AG-UI protocol 1.0 events.
    Agui,
    /// The AI SDK UI message stream v1.
    Vercel,
}

impl Format {
    /// Every format, in documentation order.
    pub const ALL: [Format; 7] = [
        Format::Native,
        Format::Multica,
        Format::Chunks,
        Format::Hier,
        Format::Typed,
        Format::Agui,
        Format::Vercel,
    ];

    /// The `?format=` name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Native => "native",
            Format::Multica => "multica",
            Format::Chunks => "chunks",
            Format::Hier => "hier",
            Format::Typed => "typed",
            Format::Agui => "agui",
            Format::Vercel => "vercel",
        }
    }

    /// Parses a `?format=` value (absent: native).
    pub fn parse(s: Option<&str>) -> Result<Format> {
        let Some(s) = s else { return Ok(Format::Native) };
        Format::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
            Rejection::new(
                ErrorCode::InvalidParameter,
                format!(
                    "`format` must be one of {}, not `{}`",
                    names.join(", "),
                    s.chars().take(40).collect::<String>()
                ),
            )
        })
    }

    /// Extra response headers the dialect's clients expect on SSE.
    pub fn sse_headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Format::Vercel => &[("x-vercel-ai-ui-message-stream", "v1"), ("x-accel-buffering", "no")],
            _ => &[],
        }
    }

    /// How a resumed stream in this dialect brings its client up to date.
    pub fn resume(self) -> Resume {
        encoder(self).resume()
    }
}

/// How a dialect resumes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Continue with the first item the client has not seen.
    Exact,
    /// Open like a new stream, re-synchronise the client from the view, continue.
    Resync,
}

/// How a client may lose an item under backpressure (seed 004 R4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Never dropped, merged or delayed.
    Control,
    /// Reasoning deltas: dropped first.
    Reasoning,
    /// Text deltas: dropped second.
    Text,
}

/// What a delta extends (a message's text, a reasoning stream, a child's output...):
/// deltas of one lane concatenate, of different lanes never. A hash of the dialect's
/// own names for it, so comparing lanes costs nothing per delta.
pub type Lane = u64;

/// The lane named by `parts` (stable across processes: resume recomputes it).
pub fn lane(parts: impl Hash) -> Lane {
    let mut h = rustc_hash::FxHasher::default();
    parts.hash(&mut h);
    h.finish()
}

/// The body of an encoded item.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// A JSON document.
    Json(Value),
    /// A literal line (the AI SDK's `[DONE]`).
    Text(&'static str),
    /// A JSON document already rendered, shared by every subscriber of a page (the
    /// native envelope of a stored event); [`Out::materialize`] turns it into `Json`
    /// when an item must change (merging, `dropped_count`).
    Wire(Wire),
}

/// A page's rendering of one event, shared by every subscriber of the page: the JSON,
/// and room for the transport's framing of it (the whole SSE frame), also built once.
///
/// An item whose data is `Wire` is exactly as the page rendered it, since any change
/// materializes it first; so its frame is the same for every subscriber.
#[derive(Debug, Clone)]
pub struct Wire {
    json: bytes::Bytes,
    framed: std::sync::Arc<std::sync::OnceLock<bytes::Bytes>>,
}

impl Wire {
    /// A rendering of `json`.
    pub fn new(json: Vec<u8>) -> Wire {
        Wire { json: json.into(), framed: Default::default() }
    }

    /// The JSON document.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// The JSON document as shared bytes: a transport whose frame is the document
    /// itself sends these to every subscriber instead of a copy each.
    pub fn json_bytes(&self) -> bytes::Bytes {
        self.json.clone()
    }

    /// The item as framed by the transport: `frame` runs for the first subscriber that
    /// asks, the others share its bytes.
    pub fn framed(&self, frame: impl FnOnce() -> bytes::Bytes) -> bytes::Bytes {
        self.framed.get_or_init(frame).clone()
    }

    /// True when both are the same rendering (not a copy of it).
    pub fn same(&self, o: &Wire) -> bool {
        self.json.as_ptr() == o.json.as_ptr() && std::sync::Arc::ptr_eq(&self.framed, &o.framed)
    }
}

impl PartialEq for Wire {
    fn eq(&self, o: &Wire) -> bool {
        self.json == o.json
    }
}

/// One encoded item: an SSE frame's `data` or a JSONL line.
#[derive(Debug, Clone, PartialEq)]
pub struct Out {
    /// Seq of the (last) event it covers.
    pub seq: i64,
    /// First seq it covers (differs from `seq` once deltas were merged).
    pub first_seq: i64,
    /// Its place among the items of event `seq` (0 for the first).
    pub part: u32,
    /// True for the last item of event `seq`.
    pub last: bool,
    /// SSE `event:` name, for dialects that use one.
    pub event: Option<std::borrow::Cow<'static, str>>,
    /// The body.
    pub data: Data,
    /// Control, text or reasoning.
    pub class: Class,
    /// The lane of a delta; `None` for everything else.
    pub lane: Option<Lane>,
    /// Set on the last JSON item of the run's terminal event (where `dropped_count` goes).
    pub terminal: bool,
    /// Where a client that got this item resumes from (its SSE `id`): set by the
    /// shaper, or by the encoding for the items that open a stream.
    pub id: Option<Cursor>,
}

impl Out {
    /// A control item for the event at `seq`.
    pub fn control(seq: i64, data: Value) -> Out {
        Out {
            seq,
            first_seq: seq,
            part: 0,
            last: true,
            event: None,
            data: Data::Json(data),
            class: Class::Control,
            lane: None,
            terminal: false,
            id: None,
        }
    }

    /// A delta of `class` in `lane`, for the event at `seq`.
    pub fn delta(seq: i64, class: Class, lane: Lane, data: Value) -> Out {
        Out { class, lane: Some(lane), ..Out::control(seq, data) }
    }

    /// The JSON body, if it has one.
    pub fn json(&self) -> Option<&Value> {
        match &self.data {
            Data::Json(v) => Some(v),
            Data::Text(_) | Data::Wire(_) => None,
        }
    }

    /// The JSON body whatever its form (a shared rendering is parsed).
    pub fn to_json(&self) -> Option<Value> {
        match &self.data {
            Data::Json(v) => Some(v.clone()),
            Data::Text(_) => None,
            Data::Wire(w) => serde_json::from_slice(w.json()).ok(),
        }
    }

    /// The item with its JSON serialised into a shared rendering (see [`Wire`]).
    pub fn into_shared(mut self) -> Out {
        if let Data::Json(v) = &self.data {
            // Serialising a `Value` cannot fail (its keys are strings).
            if let Ok(json) = serde_json::to_vec(v) {
                self.data = Data::Wire(Wire::new(json));
            }
        }
        self
    }

    /// Parses a shared rendering into a JSON document the item owns.
    pub fn materialize(&mut self) {
        if let Data::Wire(w) = &self.data {
            // Rendered by serde_json from a stored event: it parses.
            self.data = Data::Json(serde_json::from_slice(w.json()).unwrap_or_default());
        }
    }

    /// The body as it goes on the wire; a shared rendering is borrowed, not copied.
    pub fn to_text(&self) -> std::borrow::Cow<'_, str> {
        match &self.data {
            Data::Json(v) => v.to_string().into(),
            Data::Text(t) => (*t).into(),
            // serde_json output: UTF-8 by construction, so this borrows. `from_utf8`
            // checks it several times faster than `from_utf8_lossy`'s walk, which was
            // 1% of the service's instructions under many-runs (docs/benchmarks-log.md,
            // 2026-11-30 18:28).
            Data::Wire(w) => match std::str::from_utf8(w.json()) {
                Ok(s) => s.into(),
                Err(_) => String::from_utf8_lossy(w.json()),
            },
        }
    }

    /// The position right after this item, as the stream sent it in order.
    pub fn position(&self) -> Cursor {
        if self.last {
            Cursor::at(self.seq)
        } else {
            Cursor::within(self.seq, self.part + 1)
        }
    }

    /// Its id (`position()` until the shaper says otherwise).
    pub fn cursor(&self) -> Cursor {
        self.id.clone().unwrap_or_else(|| self.position())
    }
}

/// What an encoder knows about the run it encodes.
#[derive(Debug, Clone, Default)]
pub struct RunCtx {
    /// The run.
    pub run_id: String,
    /// The top of its run tree.
    pub root_run_id: String,
}

/// What an encoder sees for one event: the fold after it, and what it changed.
pub struct Step<'a> {
    /// The event.
    pub event: &'a Event,
    /// The view after folding it.
    pub view: &'a RunView,
    /// What it changed.
    pub change: Change,
    /// The run.
    pub run: &'a RunCtx,
    /// Where the event's native rendering is kept for everyone reading the same page.
    pub wire: Option<&'a std::sync::OnceLock<Wire>>,
}

/// One dialect's renderer. Stateless: everything it needs is in the view, so a stream
/// can start from the view at any cursor.
pub trait Encoder: Sync {
    /// True when the encoder reads the view (native does not, so it skips the fold).
    fn needs_view(&self) -> bool {
        true
    }

    /// How a resumed stream brings its client up to date.
    fn resume(&self) -> Resume {
        Resume::Exact
    }

    /// Items that open a stream whose client has seen the run up to `view.seq` (0: a
    /// new client), and items past it when `past` (a cut inside an event, or a merged
    /// frame ahead of it). Resync dialects re-synchronise the client here.
    fn open(&self, _run: &RunCtx, _view: &RunView, _past: bool, _out: &mut Vec<Out>) {}

    /// For a resync dialect: the classes of items a client keeps through the
    /// re-synchronisation at `view` (its protocol leaves them alone). A resumed stream
    /// drops those the client has seen, as an exact dialect does.
    fn kept_through_resync(&self, _view: &RunView) -> &'static [Class] {
        &[]
    }

    /// Renders one event.
    fn encode(&self, step: &Step<'_>, out: &mut Vec<Out>);

    /// Folds `next` into `pending`, two deltas of one lane; false leaves both as they are.
    fn merge(&self, pending: &mut Out, next: &Out) -> bool;

    /// Records on the terminal item how many deltas a slow client lost.
    fn annotate_dropped(&self, data: &mut Value, dropped: u64) {
        data["dropped_count"] = dropped.into();
    }
}

fn encoder(format: Format) -> &'static dyn Encoder {
    match format {
        Format::Native => &native::Native,
        Format::Multica => &multica::Multica,
        Format::Chunks => &chunks::Chunks,
        Format::Hier => &hier::Hier,
        Format::Typed => &typed::Typed,
        Format::Agui => &agui::Agui,
        Format::Vercel => &vercel::Vercel,
    }
}

/// A stream in one dialect: the shared fold plus the encoder.
pub struct Encoding {
    format: Format,
    run: RunCtx,
    /// The fold; none for encoders that do not read it (a live native stream then holds
    /// no view: it is per subscriber, and an empty guard is not free).
    view: Option<Box<RunView>>,
    /// Seq the stream starts after.
    start: i64,
    encoder: &'static dyn Encoder,
    /// The opening, rendered once for every stream of the run that starts at this seq
    /// in this format (see [`Encoding::shared_open`]).
    opening: Option<Vec<Out>>,
    /// The view went to the run's shared fold ([`Encoding::detach_view`]).
    detached: bool,
    /// Where the client stands ([`Encoding::resume_at`]).
    client: Cursor,
    /// What the client keeps through a resync ([`Encoder::kept_through_resync`]).
    kept: &'static [Class],
}

/// The view handed to encoders that do not read it.
static NO_VIEW: std::sync::LazyLock<RunView> = std::sync::LazyLock::new(RunView::new);

impl Encoding {
    /// Encodes `run` in `format`, continuing from `view` (the fold up to where the stream
    /// starts; empty when it starts at the beginning).
    pub fn new(format: Format, run: RunCtx, view: RunView) -> Encoding {
        let encoder = encoder(format);
        let start = view.seq;
        let view = encoder.needs_view().then(|| Box::new(view));
        Encoding::with(format, encoder, run, view, start)
    }

    /// `Encoding::new(format, run, RunView::new())`, without making the view when the
    /// dialect does not read it: an empty view allocates its guard's persistent maps,
    /// about 1,000 instructions, and the native encoding of each live page made one to
    /// drop it (docs/benchmarks-log.md, 2026-11-30 20:55).
    pub fn fresh(format: Format, run: RunCtx) -> Encoding {
        let encoder = encoder(format);
        let view = encoder.needs_view().then(|| Box::new(RunView::new()));
        Encoding::with(format, encoder, run, view, 0)
    }

    fn with(
        format: Format,
        encoder: &'static dyn Encoder,
        run: RunCtx,
        view: Option<Box<RunView>>,
        start: i64,
    ) -> Encoding {
        Encoding {
            format,
            run,
            view,
            start,
            encoder,
            opening: None,
            detached: false,
            client: Cursor::at(start),
            kept: &[],
        }
    }

    /// The dialect.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The run it encodes.
    pub fn run(&self) -> &RunCtx {
        &self.run
    }

    /// Seq of the last event folded (0 at the start of the run).
    pub fn view_seq(&self) -> i64 {
        self.view.as_ref().map_or(self.start, |v| v.seq)
    }

    /// True when the stream needs the fold up to its cursor to start mid-run.
    pub fn needs_view(&self) -> bool {
        self.encoder.needs_view()
    }

    /// How this dialect resumes.
    pub fn resume(&self) -> Resume {
        self.encoder.resume()
    }

    /// Sets the stream up for a client standing at `cursor`, whose last complete event
    /// is where the view stands (for encoders that read it).
    pub fn resume_at(&mut self, cursor: Cursor) {
        if !cursor.is_plain() {
            // A shared opening is for clients standing exactly at its seq.
            self.opening = None;
        }
        let view: &RunView = self.view.as_deref().unwrap_or(&NO_VIEW);
        self.kept = self.encoder.kept_through_resync(view);
        self.client = cursor;
    }

    /// Where the client stands ([`Encoding::resume_at`]; the stream's start otherwise).
    pub fn client(&self) -> &Cursor {
        &self.client
    }

    /// The filter the stream's items go through, for the client's cursor.
    pub fn resumer(&self) -> Resumer {
        Resumer::new(&self.client, self.resume(), self.kept)
    }

    /// The items that open the stream (before any event is pushed): their id is the
    /// position the stream starts at, so a client cut off among them resumes there.
    pub fn open(&self) -> Vec<Out> {
        if let Some(shared) = &self.opening {
            return shared.clone();
        }
        let mut out = vec![];
        let view: &RunView = self.view.as_deref().unwrap_or(&NO_VIEW);
        // A cursor inside an event, or with lanes, has seen items past the view.
        self.encoder.open(&self.run, view, !self.client.is_plain(), &mut out);
        let at = self.view_seq();
        for o in &mut out {
            o.seq = at;
            o.first_seq = at;
            o.class = Class::Control;
            o.lane = None;
            o.id = Some(Cursor::at(at));
        }
        if view.state().is_some_and(|s| s.is_terminal()) {
            if let Some(last) = out.iter_mut().rev().find(|o| !matches!(o.data, Data::Text(_))) {
                last.terminal = true;
            }
        }
        out
    }

    /// [`Encoding::open`] as shared renderings: serialised once, framed once by the first
    /// stream that sends them, and cloned cheaply. A resync dialect's opening holds the
    /// whole view (AG-UI's MESSAGES_SNAPSHOT), the same for every client that resumes
    /// at this seq, so a crowd joining a long run renders it once.
    pub fn shared_open(&self) -> Vec<Out> {
        self.open().into_iter().map(Out::into_shared).collect()
    }

    /// Opens with `items`, a [`Encoding::shared_open`] of the same run, format and seq.
    pub fn with_opening(mut self, items: Vec<Out>) -> Encoding {
        self.opening = Some(items);
        self
    }

    /// Folds one event and renders it.
    pub fn push(&mut self, e: &Event) -> Vec<Out> {
        let mut out = vec![];
        self.push_into(e, None, &mut out);
        out
    }

    /// Folds one event and renders it, appending to `out` (a live stream reuses one
    /// vector for a whole page); an encoder that renders the event the same way for every
    /// subscriber of a shared page keeps the rendering in `wire`, once.
    pub fn push_into(&mut self, e: &Event, wire: Option<&std::sync::OnceLock<Wire>>, out: &mut Vec<Out>) {
        debug_assert!(!self.detached, "a detached encoding renders from a shared fold only");
        let change = match self.view.as_mut() {
            Some(v) => v.apply(e),
            None => Change::Nothing,
        };
        let view: &RunView = self.view.as_deref().unwrap_or(&NO_VIEW);
        let step = Step { event: e, view, change, run: &self.run, wire };
        render(self.format, &step, out);
    }

    /// Renders the opening now and hands over the fold: a live stream's events are then
    /// rendered by the run's shared fold (see [`render`]), not by this encoding, so it
    /// holds no copy of the view. [`Encoding::push_into`] must not be called after this.
    pub fn detach_view(&mut self) -> Option<RunView> {
        if self.opening.is_none() {
            self.opening = Some(self.open());
        }
        self.start = self.view_seq();
        self.detached = true;
        self.view.take().map(|v| *v)
    }

    /// See [`Encoder::merge`]: `next` joins `pending` (both deltas of one lane).
    pub fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        if pending.lane.is_none() || pending.lane != next.lane {
            return false;
        }
        pending.materialize();
        let merged = if let Data::Wire(_) = next.data {
            let mut next = next.clone();
            next.materialize();
            self.encoder.merge(pending, &next)
        } else {
            self.encoder.merge(pending, next)
        };
        if merged {
            pending.seq = next.seq;
            pending.part = next.part;
            pending.last = next.last;
            // Text outranks reasoning when a lane carries both (multica's snapshots).
            pending.class = pending.class.max(next.class);
        }
        merged
    }

    /// See [`Encoder::annotate_dropped`].
    pub fn annotate_dropped(&self, out: &mut Out, dropped: u64) {
        out.materialize();
        if let Data::Json(v) = &mut out.data {
            self.encoder.annotate_dropped(v, dropped);
        }
    }
}

/// Renders one event in `format` from the fold after it (`step`), appending its items
/// to `out`: numbered within the event, the terminal one marked. The one rendering path:
/// a stream's own [`Encoding`] and a run's shared fold (every subscriber of a format
/// takes the same items) both come here.
pub fn render(format: Format, step: &Step<'_>, out: &mut Vec<Out>) {
    let start = out.len();
    encoder(format).encode(step, out);
    let n = out.len() - start;
    for (i, o) in out[start..].iter_mut().enumerate() {
        o.part = i as u32;
        o.last = i + 1 == n;
    }
    if step.event.is_run_end() {
        if let Some(last) = out[start..].iter_mut().rev().find(|o| !matches!(o.data, Data::Text(_))) {
            last.terminal = true;
        }
    }
}

/// True when `format`'s encoder reads the fold (native renders from the event alone).
pub fn needs_view(format: Format) -> bool {
    encoder(format).needs_view()
}

/// Milliseconds since the epoch of an event (AG-UI's `timestamp`).
fn millis(e: &Event) -> i64 {
    e.ts.timestamp_millis()
}

/// A scope-qualified id: children's ids may repeat the parent's, so they are prefixed.
fn scoped_id(child: Option<&str>, id: &str) -> String {
    match child {
        Some(c) => format!("{c}/{id}"),
        None => id.to_owned(),
    }
}

/// A JSON value as text (strings as they are, anything else as JSON).
fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A tool's arguments as JSON text: `{}` when it was called without any.
fn args_text(v: &Value) -> String {
    match v {
        Value::Null => "{}".to_owned(),
        other => other.to_string(),
    }
}

/// Appends `b`'s string at `path` to `a`'s (merging two deltas).
fn concat_at(a: &mut Value, b: &Value, path: &[&str]) -> bool {
    let (Some(x), Some(y)) = (pointer_mut(a, path), pointer(b, path)) else { return false };
    match (x, y) {
        (Value::String(x), Value::String(y)) => {
            x.push_str(y);
            true
        }
        _ => false,
    }
}

fn pointer<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn pointer_mut<'a>(v: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| v.get_mut(*k))
}

#[cfg(test)]
mod clients;
#[cfg(test)]
mod conformance;
#[cfg(test)]
mod resume_tests;
