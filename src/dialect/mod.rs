//! Dialects: the same log and the same fold, spoken in each client's protocol.
//!
//! An [`Encoding`] owns the one [`RunView`] of a stream and one [`Encoder`]. Each event
//! is folded once by the shared reducer; the encoder then renders the event with what
//! the fold says it changed ([`Change`]), never folding anything itself. SSE, replay,
//! JSONL export and the `runEvents` subscription all encode through here.
//!
//! Every encoded item carries the seq of the event it came from, so `id:` on SSE (and
//! so `Last-Event-ID` resume) works in every dialect.

mod agui;
mod chunks;
mod hier;
mod multica;
mod native;
mod typed;
mod vercel;

use serde_json::Value;

use crate::domain::Event;
use crate::error::{Error, ErrorCode, Result};
use crate::live::is_run_end;
use crate::projection::{Change, RunView};

/// A client protocol, chosen with `?format=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
            Error::reject(
                ErrorCode::InvalidParameter,
                format!("`format` must be one of {}, not `{s}`", names.join(", ")),
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
}

/// How a client may lose an item under backpressure (seed 004 R4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Never dropped, merged or delayed.
    Control,
    /// Text deltas: dropped second.
    Text,
    /// Reasoning deltas: dropped first.
    Reasoning,
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
    /// Seq of the (last) event it covers: the SSE `id`.
    pub seq: i64,
    /// First seq it covers (differs from `seq` once deltas were merged).
    pub first_seq: i64,
    /// SSE `event:` name, for dialects that use one.
    pub event: Option<std::borrow::Cow<'static, str>>,
    /// The body.
    pub data: Data,
    /// Control, text or reasoning.
    pub class: Class,
    /// Set on the last JSON item of the run's terminal event (where `dropped_count` goes).
    pub terminal: bool,
}

impl Out {
    /// A control item for the event at `seq`.
    pub fn control(seq: i64, data: Value) -> Out {
        Out {
            seq,
            first_seq: seq,
            event: None,
            data: Data::Json(data),
            class: Class::Control,
            terminal: false,
        }
    }

    /// An item of class `class` for the event at `seq`.
    pub fn of(seq: i64, class: Class, data: Value) -> Out {
        Out { class, ..Out::control(seq, data) }
    }

    /// The JSON body, if it has one.
    pub fn json(&self) -> Option<&Value> {
        match &self.data {
            Data::Json(v) => Some(v),
            Data::Text(_) | Data::Wire(_) => None,
        }
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
            // serde_json output: UTF-8 by construction, so this borrows.
            Data::Wire(w) => String::from_utf8_lossy(w.json()),
        }
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

/// One dialect's renderer.
pub trait Encoder: Send {
    /// True when the encoder reads the view (native does not, so it skips the fold).
    fn needs_view(&self) -> bool {
        true
    }

    /// Items that open a stream read from the start of the run (before seq 1).
    fn begin(&mut self, _run: &RunCtx, _out: &mut Vec<Out>) {}

    /// Renders one event.
    fn encode(&mut self, step: &Step<'_>, out: &mut Vec<Out>);

    /// Folds `next` into `pending` when both are deltas that can travel as one item;
    /// false leaves both as they are.
    fn merge(&self, _pending: &mut Out, _next: &Out) -> bool {
        false
    }

    /// Records on the terminal item how many deltas a slow client lost.
    fn annotate_dropped(&self, data: &mut Value, dropped: u64) {
        data["dropped_count"] = dropped.into();
    }
}

fn encoder(format: Format) -> Box<dyn Encoder> {
    match format {
        Format::Native => Box::new(native::Native),
        Format::Multica => Box::<multica::Multica>::default(),
        Format::Chunks => Box::new(chunks::Chunks),
        Format::Hier => Box::<hier::Hier>::default(),
        Format::Typed => Box::new(typed::Typed),
        Format::Agui => Box::<agui::Agui>::default(),
        Format::Vercel => Box::<vercel::Vercel>::default(),
    }
}

/// A stream in one dialect: the shared fold plus the encoder.
pub struct Encoding {
    format: Format,
    run: RunCtx,
    /// The fold; none for encoders that do not read it (a live native stream then holds
    /// no view: it is per subscriber, and an empty guard is not free).
    view: Option<Box<RunView>>,
    encoder: Box<dyn Encoder>,
}

/// The view handed to encoders that do not read it.
static NO_VIEW: std::sync::LazyLock<RunView> = std::sync::LazyLock::new(RunView::new);

impl Encoding {
    /// Encodes `run` in `format`, continuing from `view` (the fold up to the stream's
    /// cursor; empty when it starts at the beginning).
    pub fn new(format: Format, run: RunCtx, view: RunView) -> Encoding {
        let encoder = encoder(format);
        let view = encoder.needs_view().then(|| Box::new(view));
        Encoding { format, run, view, encoder }
    }

    /// The dialect.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Seq of the last event folded (0 at the start of the run).
    pub fn view_seq(&self) -> i64 {
        self.view.as_ref().map_or(0, |v| v.seq)
    }

    /// True when the stream needs the fold up to its cursor to start mid-run.
    pub fn needs_view(&self) -> bool {
        self.encoder.needs_view()
    }

    /// The opening items of a stream that starts at the beginning of the run.
    pub fn begin(&mut self) -> Vec<Out> {
        let mut out = vec![];
        self.encoder.begin(&self.run, &mut out);
        out
    }

    /// Folds one event and renders it.
    pub fn push(&mut self, e: &Event) -> Vec<Out> {
        self.push_shared(e, None)
    }

    /// [`Encoding::push`] for an event of a shared page: an encoder that renders the
    /// event the same way for every subscriber keeps the rendering in `wire`, once.
    pub fn push_shared(&mut self, e: &Event, wire: Option<&std::sync::OnceLock<Wire>>) -> Vec<Out> {
        let mut out = vec![];
        self.push_into(e, wire, &mut out);
        out
    }

    /// [`Encoding::push_shared`], appending to `out` (a live stream reuses one vector
    /// for a whole page instead of allocating one per event per subscriber).
    pub fn push_into(&mut self, e: &Event, wire: Option<&std::sync::OnceLock<Wire>>, out: &mut Vec<Out>) {
        let change = match self.view.as_mut() {
            Some(v) => v.apply(e),
            None => Change::Nothing,
        };
        let start = out.len();
        let view: &RunView = self.view.as_deref().unwrap_or(&NO_VIEW);
        let step = Step { event: e, view, change, run: &self.run, wire };
        self.encoder.encode(&step, out);
        if is_run_end(e) {
            if let Some(last) = out[start..].iter_mut().rev().find(|o| !matches!(o.data, Data::Text(_))) {
                last.terminal = true;
            }
        }
    }

    /// See [`Encoder::merge`].
    pub fn merge(&self, pending: &mut Out, next: &Out) -> bool {
        if pending.class == Class::Control || next.class != pending.class || next.event != pending.event {
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

/// True when `a` and `b` agree at every path.
fn same_at(a: &Value, b: &Value, paths: &[&[&str]]) -> bool {
    paths.iter().all(|p| pointer(a, p) == pointer(b, p))
}

#[cfg(test)]
mod conformance;
