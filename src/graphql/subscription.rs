//! Subscription root. Live operations read through the same [`Tail`] as SSE, and
//! `runView` renders the same reducer's changes as the `run` query's view.

use std::sync::Arc;

use async_graphql::{Context, Subscription, ID};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};

use super::error::GqlResult;
use super::schema::GqlRun;
use super::schema::{app, caller, GqlEvent};
use crate::app::check_cursor;
use crate::dialect::{Cursor, Format, RunCtx};
use crate::error::{Error, ErrorCode};
use crate::live::activity::{self, ActivityKind};
use crate::live::{Tail, Want};
use crate::projection::ViewUpdate;
use crate::storage::events::Filter;
use serde_json::Value;

/// A run that was created or changed state (an item of `runsActivity`).
#[derive(async_graphql::SimpleObject)]
#[graphql(name = "RunActivity")]
pub struct GqlRunActivity {
    /// What happened.
    kind: ActivityKind,
    /// The run as it is now.
    run: GqlRun,
}

/// Live operations (WebSocket at `/graphql/ws`, graphql-transport-ws or the legacy
/// subscriptions-transport-ws; the API key goes in `connection_init`).
pub struct Subscription;

fn cursor(after_seq: Option<i64>) -> async_graphql::Result<i64> {
    match after_seq {
        Some(a) if a < 0 => {
            Err(Error::reject(ErrorCode::InvalidParameter, "`afterSeq` must be 0 or more")).gql()
        }
        a => Ok(a.unwrap_or(0)),
    }
}

/// A slot among the socket's open operations (WebSocket only: over HTTP there is no
/// socket, and no subscription either).
fn slot(ctx: &Context<'_>) -> async_graphql::Result<Option<super::ws::OperationSlot>> {
    let Some(ops) = ctx.data_opt::<super::ws::Operations>() else { return Ok(None) };
    let max = app(ctx)?.settings.ws.max_operations;
    ops.take(max).map(Some).gql()
}

/// `stream`, holding `slot` for as long as it lives.
fn holding<S: Stream>(stream: S, slot: Option<super::ws::OperationSlot>) -> impl Stream<Item = S::Item> {
    stream.map(move |item| {
        let _held = &slot;
        item
    })
}

/// True when `run` has ended and nothing of it is left after `cursor`.
fn ended(run: &crate::storage::runs::RunInfo, cursor: i64) -> bool {
    run.state.is_some_and(|s| s.is_terminal()) && cursor >= run.last_seq
}

/// A tail's batches as a stream; ends after the run's terminal event.
fn batches(tail: Tail) -> impl Stream<Item = crate::live::Batch> {
    futures::stream::unfold(tail, |mut t| async move { t.next_batch().await.map(|b| (b, t)) })
}

/// A tail's events as a stream, each still in the page it shares with the run's other
/// subscribers, with its items in `format` as the run's fold rendered them (when the
/// tail wants that rendering); ends after the run's terminal event.
fn events(tail: Tail, format: Option<Format>) -> impl Stream<Item = (GqlEvent, Option<Vec<Value>>)> {
    batches(tail).flat_map(move |b| {
        let mut encoded = format.and_then(|f| b.rendered(f)).map(|r| {
            r.map(|items| items.iter().filter_map(|o| o.to_json()).collect::<Vec<_>>()).collect::<Vec<_>>()
        });
        let events: Vec<_> = (0..b.events().len())
            .map(|i| (GqlEvent::shared(&b, i), encoded.as_mut().map(|e| std::mem::take(&mut e[i]))))
            .collect();
        futures::stream::iter(events)
    })
}

#[Subscription]
impl Subscription {
    /// The run's events after `afterSeq` (default 0), then each new one as it commits;
    /// completes after the run's terminal lifecycle event. Resume with the last `seq`
    /// received as `afterSeq`.
    async fn run_events(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        after_seq: Option<i64>,
        #[graphql(desc = "Only these event types.")] types: Option<Vec<String>>,
        #[graphql(desc = "Only this child's events.")] child_id: Option<String>,
        #[graphql(desc = "A dialect (native, multica, chunks, hier, typed, agui, vercel): each event also \
                          carries what it became in it, in `encoded`.")]
        format: Option<String>,
    ) -> async_graphql::Result<BoxStream<'static, GqlEvent>> {
        let slot = slot(ctx)?;
        let app = app(ctx)?.clone();
        let who = caller(ctx)?.clone();
        let after = cursor(after_seq)?;
        let format = Format::parse(format.as_deref()).gql()?;
        let run = app.run(&who, &run_id).await.gql()?;
        check_cursor(&run, &Cursor::at(after)).gql()?;
        // Nothing is left after the cursor of a finished run: complete at once, as SSE
        // answers 204 (a tail would wait for a terminal event that came before it).
        let finished = ended(&run, after);
        let mut enc = match format {
            Format::Native => None,
            f => Some(app.encoding(&who, &run, f, &Cursor::at(after)).await.gql()?),
        };
        // A resync dialect's snapshot rides with the first event after the cursor.
        let mut opening: Vec<Value> =
            enc.as_ref().map(|e| e.open().iter().filter_map(|o| o.to_json()).collect()).unwrap_or_default();
        let filter = Filter::new(types, child_id).gql()?;
        let delivery = app.metrics.subscription(crate::metrics::Transport::GRAPHQL_WS);
        let traced = app.clone();
        // The items come from the run's shared fold: the encoding's view goes to the tail,
        // for what it reads on its own.
        let tail = match enc.as_mut() {
            Some(enc) => app.live_tail(who, enc, after),
            None => Tail::new(app.live.clone(), who, run.run_id, after),
        };
        let rendered = enc.as_ref().map(|e| e.format());
        let events = events(tail, rendered).filter_map(move |(mut g, items)| {
            let mut own = false;
            let encoded = rendered.map(|_| {
                let mut all = std::mem::take(&mut opening);
                own = !all.is_empty();
                all.extend(items.unwrap_or_default());
                all
            });
            g.own = own;
            let e = g.event();
            let keep = filter.keeps(e);
            if keep {
                delivery.delivered(e);
                traced.traces.delivered(&e.run_id, e.seq, "graphql_ws");
            }
            g.encoded = encoded;
            futures::future::ready(keep.then_some(g))
        });
        let events = if finished { futures::stream::empty().left_stream() } else { events.right_stream() };
        let events = holding(events, slot).boxed();
        // On a GraphQL WebSocket the executor takes the events and renders them, sharing
        // each page's renderings among subscribers that ask the same (`super::shared`).
        let Some(capture) = ctx.data_opt::<super::shared::Capture>() else { return Ok(events) };
        // Where the stream starts does not change how an event renders.
        let cursor_variable = match ctx.item.node.get_argument("afterSeq").map(|v| &v.node) {
            Some(async_graphql_value::Value::Variable(name)) => Some(name.to_string()),
            _ => None,
        };
        Ok(capture.hand_over(super::shared::Captured { events, cursor_variable }))
    }

    /// Changes to the run's view after `afterSeq` (default 0), each with the seq that
    /// made it; completes after the run's terminal lifecycle event. Folding them over
    /// the view at `afterSeq` (see the `ViewUpdate` rules) gives exactly the `run`
    /// query's view at every seq. With `snapshot: true` the first update is the whole
    /// view at `afterSeq`, or at the newest seq when `afterSeq` is not given.
    async fn run_view(
        &self,
        ctx: &Context<'_>,
        run_id: ID,
        after_seq: Option<i64>,
        #[graphql(default = false)] snapshot: bool,
    ) -> async_graphql::Result<impl Stream<Item = ViewUpdate>> {
        let slot = slot(ctx)?;
        let app = app(ctx)?.clone();
        let who = caller(ctx)?.clone();
        let after = cursor(after_seq)?;
        if after_seq.is_some() {
            let run = app.run(&who, &run_id).await.gql()?;
            check_cursor(&run, &Cursor::at(after)).gql()?;
        }
        let (run, view) = match (after_seq, snapshot) {
            (None, true) => {
                let (run, v) = app.view(&who, &run_id).await.gql()?;
                (run, Arc::unwrap_or_clone(v))
            }
            _ => app.view_at(&who, &run_id, after).await.gql()?,
        };
        let start = view.seq;
        let finished = ended(&run, start);
        let first = snapshot.then(|| ViewUpdate::snapshot(Arc::new(view.clone())));
        let delivery = app.metrics.subscription(crate::metrics::Transport::GRAPHQL_WS);
        let traced = app.clone();
        // The updates come from the run's shared fold; the view at the start is the
        // tail's, for what it reads on its own.
        let ctx = RunCtx { run_id: run.run_id.clone(), root_run_id: run.root_run_id.clone() };
        let tail = Tail::rendering(app.live.clone(), who, ctx, start, Some(Want::Updates), Some(view));
        let live = batches(tail)
            .map(move |batch| {
                let mut out = vec![];
                delivery.delivered_at(batch.ts_micros());
                for e in batch.events() {
                    traced.traces.delivered(&e.run_id, e.seq, "graphql_ws");
                }
                // A tail that wants updates hands out batches that carry them.
                for ups in batch.updates().into_iter().flatten() {
                    out.extend_from_slice(ups);
                }
                out
            })
            .flat_map(futures::stream::iter);
        let live = if finished { futures::stream::empty().left_stream() } else { live.right_stream() };
        Ok(holding(futures::stream::iter(first).chain(live), slot))
    }

    /// The tenant's runs as they are created and change lifecycle state, for list
    /// pages: each item is a run's current row (upsert it by `runId`). Starts with the
    /// runs created or moved in the 5 s before the subscription began (so a list read
    /// just before it misses nothing), then every change.
    async fn runs_activity(
        &self,
        ctx: &Context<'_>,
    ) -> async_graphql::Result<impl Stream<Item = GqlRunActivity>> {
        let slot = slot(ctx)?;
        let app = app(ctx)?.clone();
        let who = caller(ctx)?.clone();
        who.require(crate::auth::Scope::Read).gql()?;
        let items = activity::stream(app.live.clone(), who).await.gql()?;
        Ok(holding(items.map(|a| GqlRunActivity { kind: a.kind, run: GqlRun::from(a.run) }), slot))
    }
}
